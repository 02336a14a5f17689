"""Every place the component reaches into another project's private internals, in one module,
so an upgrade has one file to check. Dynamo's and NIXL's public APIs suffice; SGLang 0.5.23's
do not:

- ``Engine._scheduler_init_result`` (the scheduler's resolved pool size),
  ``tokenizer_manager.rid_to_state`` (requests still tracked), ``_handle_abort_req`` (ending a
  request as a scheduler abort does), ``load_snapshot_reader`` (the scheduler's own request
  counts, shared by every tokenizer process), and argparse's private
  ``_actions`` / ``_add_action`` to file ``ServerArgs``' flags under their own help group.

Two SGLang releases are supported and tested: 0.5.23 and 0.5.21 (Dynamo 1.6.1's own). What
differs between them is decided here, from ``SGLANG_VERSION`` alone:

- 0.5.21's ``TokenizerManager._handle_batch_request`` leaves states behind on parallel
  sampling (``sglang_adapt_tokenizer_manager``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
from typing import Any

from packaging.version import Version


def _installed_version(dist: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(dist))
    except importlib.metadata.PackageNotFoundError:
        return None


# The installed SGLang (None: none), read from its metadata without importing it; every
# version-dependent path of the component tests this and nothing else.
SGLANG_VERSION = _installed_version("sglang")


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


def sglang_adapt_tokenizer_manager(manager: Any) -> None:
    """What SGLang's TokenizerManager needs in this version, applied once per engine (and per
    attached tokenizer process)."""
    if SGLANG_VERSION is not None and SGLANG_VERSION < Version("0.5.23"):
        _drop_parallel_sample_leftovers(manager)


def _drop_parallel_sample_leftovers(manager: Any) -> None:
    """SGLang 0.5.21, a request with n > 1: its states are made for the request's own rids
    (``{rid}_0`` ... ``{rid}_{n-1}``), the samples run under fresh rids, and only ``{rid}_0``'s
    state is dropped; the others stay in ``rid_to_state`` for good, never dispatched (0.5.23
    drops them all). They are dropped here once the samples are under way, and at the end."""
    handle = manager._handle_batch_request

    def drop(rids: list[str]) -> None:
        for rid in rids:
            state = manager.rid_to_state.get(rid)
            if state is not None and not state.dispatched:
                del manager.rid_to_state[rid]

    async def handle_batch_request(obj: Any, *args: Any, **kwargs: Any) -> Any:
        own = (list(obj.rid) if getattr(obj, "parallel_sample_num", 1) > 1
               and isinstance(obj.rid, list) else [])
        try:
            async for out in handle(obj, *args, **kwargs):
                drop(own)
                yield out
        finally:
            drop(own)

    manager._handle_batch_request = handle_batch_request
