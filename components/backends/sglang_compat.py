"""Every place the component reaches into another project's private internals, in one module,
so an upgrade has one file to check. Dynamo's and NIXL's public APIs suffice; SGLang 0.5.23's
do not:

- ``Engine._scheduler_init_result`` (the scheduler's resolved pool size),
  ``tokenizer_manager.rid_to_state`` (requests still tracked), ``_handle_abort_req`` (ending a
  request as a scheduler abort does), ``load_snapshot_reader`` (the scheduler's own request
  counts, shared by every tokenizer process), and argparse's private
  ``_actions`` / ``_add_action`` to file ``ServerArgs``' flags under their own help group.
"""

from __future__ import annotations

import argparse
from typing import Any


def adopt_flags(source: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> None:
    """File ``source``'s options under ``group`` (argparse's own conflict check still runs)."""
    for action in source._actions:
        if action.option_strings:
            group._add_action(action)


def sglang_scheduler_info(engine: Any) -> dict[str, Any]:
    return engine._scheduler_init_result.scheduler_infos[0]


def sglang_requests_in_flight(engine: Any) -> int | None:
    states = getattr(engine.tokenizer_manager, "rid_to_state", None)
    return None if states is None else len(states)


def sglang_tracked_rids(engine: Any, limit: int = 64) -> list[str] | None:
    """The first `limit` rids SGLang's TokenizerManager tracks."""
    states = getattr(engine.tokenizer_manager, "rid_to_state", None)
    return sorted(states)[:limit] if isinstance(states, dict) else None


def sglang_load_snapshots(engine: Any) -> list[Any] | None:
    """The load snapshot each of SGLang's schedulers (one per DP rank) publishes, also when it
    turns idle (msgspec structs in shared memory); None where unreadable."""
    reader = getattr(engine.tokenizer_manager, "load_snapshot_reader", None)
    read_all = getattr(reader, "read_all", None)
    return (read_all() or None) if callable(read_all) else None


def sglang_scheduler_requests(engine: Any) -> int | None:
    """Requests SGLang's schedulers hold, running or waiting, whichever process sent them."""
    loads = sglang_load_snapshots(engine)
    if loads is None:
        return None
    return sum(int(load.num_running_reqs) + int(load.num_waiting_reqs) for load in loads)


def sglang_end_request(manager: Any, rid: str, reason: dict[str, Any]) -> None:
    """End one tracked request as SGLang's tokenizer ends one its scheduler aborted."""
    from sglang.srt.managers.io_struct import AbortReq

    manager._handle_abort_req(AbortReq(rid=rid, finished_reason=reason,
                                       abort_message=reason["message"]))
