"""Per-key retry backoff: a key that failed is skipped for a delay that doubles with each
consecutive failure, up to a cap; a success clears it. Keys no longer listed are forgotten, so
the table never outgrows the set of live keys."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass
class _Entry:
    retry_at: float
    delay: float


class Backoff:
    def __init__(self, first_s: float = 0.5, max_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first = first_s
        self._max = max_s
        self._clock = clock
        self._entries: dict[int, _Entry] = {}

    def failed(self, key: int) -> float:
        """Record a failure; returns the delay before `key` is tried again."""
        entry = self._entries.get(key)
        delay = self._first if entry is None else min(entry.delay * 2, self._max)
        self._entries[key] = _Entry(self._clock() + delay, delay)
        return delay

    def succeeded(self, key: int) -> None:
        self._entries.pop(key, None)

    def waiting(self, key: int) -> bool:
        entry = self._entries.get(key)
        return entry is not None and self._clock() < entry.retry_at

    def forget_all_but(self, keys: Iterable[int]) -> None:
        keep = set(keys)
        for key in [k for k in self._entries if k not in keep]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
