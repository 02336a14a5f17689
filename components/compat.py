"""Every place the component reaches into another project's private internals, in one module,
so an upgrade has one file to check. Dynamo's and NIXL's public APIs suffice; SGLang 0.5.23's
do not:

- ``Engine._scheduler_init_result`` (the scheduler's resolved pool size),
  ``tokenizer_manager.rid_to_state`` (requests still tracked), and argparse's private
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
    own = getattr(engine, "requests_in_flight", None)  # the CPU engine's count
    if callable(own):
        return own()
    states = getattr(engine.tokenizer_manager, "rid_to_state", None)
    return None if states is None else len(states)
