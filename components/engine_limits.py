"""What registration advertises about an engine's capacity, whichever engine runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    context_length: int
    max_total_num_tokens: int
    max_running_requests: int | None
    page_size: int
