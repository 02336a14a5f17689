"""One serving-path goal as the benchmarks' docs page shows it (benchmarks/goals.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

# A benchmark's JSON of the run by name (None when it did not run).
Load = Callable[[str], Optional[dict]]


@dataclass(frozen=True)
class Goal:
    what: str
    goal: str
    measured: str = "(not run)"
    met: Optional[bool] = None
    bound: str = ""


def num(value) -> float:
    return float("nan") if value is None else float(value)
