"""`routing.priority` of a preprocessed request -> the engine's `priority`, as Dynamo 1.6.1's
SGLang worker passes it (`_priority_kwargs`): a higher value is a higher priority (the worker
refuses SGLang's `--schedule-low-priority-values-first` at startup, as 1.6.1 does). The engine
orders by it only with SGLang's `--enable-priority-scheduling`; otherwise it is ignored there,
as in 1.6.1."""

from __future__ import annotations

from typing import Any, Optional

from handlers.errors import RequestError


def priority_kwargs(routing: Optional[dict[str, Any]]) -> dict[str, int]:
    value = (routing or {}).get("priority") if isinstance(routing, dict) else None
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise RequestError(f"routing.priority must be an integer, got {value!r}")
    return {"priority": int(value)}
