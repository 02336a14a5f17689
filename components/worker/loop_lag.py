"""How late the worker's event loop runs: a ticker task on the loop that sleeps a fixed period and
records, in a histogram on `/metrics`, how much later than asked it woke up.

The event loop streams every request's tokens, so anything that holds it (a long tokenization on
the loop, a GIL held for milliseconds by another thread, a starved CPU) shows up as lag here, and
as a stall in every stream of that process. The period trades resolution for cost: at 5 ms the
ticker takes about 200 wake-ups a second (well under 1% of a core), and a stall longer than the
period is always seen; a shorter one is seen when it covers a wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, Optional

PERIOD_S = 0.005


class LoopLagMonitor:
    """`start()` on the loop to watch; `observe` gets each wake-up's lag in seconds."""

    def __init__(self, observe: Callable[[float], None], period_s: float = PERIOD_S) -> None:
        self._observe = observe
        self._period_s = period_s
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick(), name="loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _tick(self) -> None:
        period, observe = self._period_s, self._observe
        while True:
            start = time.monotonic()
            await asyncio.sleep(period)
            observe(max(0.0, time.monotonic() - start - period))
