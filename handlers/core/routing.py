"""A preprocessed request's `routing` hints -> the engine's kwargs, as Dynamo 1.6.1's SGLang worker
passes them:
- `priority` -> `priority` (`_priority_kwargs`): a higher value is a higher priority (the worker
  refuses SGLang's `--schedule-low-priority-values-first` at startup, as 1.6.1 does). The engine
  orders by it only with SGLang's `--enable-priority-scheduling`; otherwise it is ignored there,
  as in 1.6.1.
- `dp_rank` -> `routed_dp_rank`: the data-parallel rank the KV router chose, whose cache it
  scored (SGLang 0.5.23's name; 1.6.1 also passes its deprecated alias `data_parallel_rank`).
  u32::MAX is the router's "unset", as 1.6.1 reads it. The engine refuses a rank it does not
  have ("routed_dp_rank=N out of range [0, D)").
- `prefill_dp_rank` (a disaggregated decode) -> `disagg_prefill_dp_rank`: the rank of the
  prefill that holds the room, so SGLang's decode does not ask that prefill's bootstrap server
  for it before the transfer can start (1.6.1's `prefill_dp_rank_kwargs`).
"""

from __future__ import annotations

from typing import Any, Optional

from handlers.core.errors import RequestError

DP_RANK_UNSET = 2**32 - 1  # the router's u32::MAX


def routing_kwargs(routing: Optional[dict[str, Any]], decode: bool = False) -> dict[str, int]:
    """Engine kwargs for `routing`; `decode`: a disaggregated decode leg (takes the prefill's
    rank too)."""
    hints = routing if isinstance(routing, dict) else {}
    out: dict[str, int] = {}
    priority = _integer(hints, "priority")
    if priority is not None:
        out["priority"] = priority
    rank = _rank(hints, "dp_rank")
    if rank is not None:
        out["routed_dp_rank"] = rank
    prefill_rank = _rank(hints, "prefill_dp_rank") if decode else None
    if prefill_rank is not None:
        out["disagg_prefill_dp_rank"] = prefill_rank
    return out


def _integer(hints: dict[str, Any], key: str) -> Optional[int]:
    value = hints.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise RequestError(f"routing.{key} must be an integer, got {value!r}")
    return int(value)


def _rank(hints: dict[str, Any], key: str) -> Optional[int]:
    rank = _integer(hints, key)
    if rank is None or rank == DP_RANK_UNSET:
        return None
    if rank < 0:
        raise RequestError(f"routing.{key} must be >= 0, got {rank}")
    return rank
