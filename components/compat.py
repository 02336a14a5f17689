"""Every place the component reaches into another project's private internals, in one module,
so an upgrade of Dynamo, NIXL or SGLang has one file to check. Each import is lazy: importing
this module loads none of them.

- Dynamo 1.6.1: ``dynamo._core.Context``, the only way to make a detached request context for a
  prefill call that has no client context (the public ``Context`` type is not exported).
- NIXL 1.5.1: ``nixl._api`` (``nixl_agent``, ``nixl_agent_config``; the package root exports
  nothing) and ``nixl._bindings``, whose exception classes are the errors NIXL calls raise.
- SGLang 0.5.23: ``Engine._scheduler_init_result`` (the scheduler's resolved pool size),
  ``tokenizer_manager.rid_to_state`` (requests still tracked), and argparse's private
  ``_actions`` / ``_add_action`` to file ``ServerArgs``' flags under their own help group.
"""

from __future__ import annotations

import argparse
from typing import Any


def dynamo_context_type() -> type:
    from dynamo._core import Context

    return Context


def nixl_agent(name: str, backends: list[str]) -> Any:
    """An agent without NIXL's progress and listen threads (the owner progresses UCX)."""
    from nixl._api import nixl_agent as agent, nixl_agent_config

    config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                               backends=backends)
    return agent(name, config)


def nixl_errors() -> tuple[type[BaseException], ...]:
    from nixl import _bindings

    found = tuple(
        obj for name, obj in vars(_bindings).items()
        if name.startswith("nixl") and isinstance(obj, type) and issubclass(obj, Exception)
    )
    return found or (RuntimeError,)


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
