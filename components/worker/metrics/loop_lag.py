"""How late the worker's event loop runs: a sampling timer on the loop that sleeps a random
period and records, in a histogram on `/metrics`, how much later than asked it woke up.

The event loop streams every request's tokens, so anything that holds it (a long tokenization on
the loop, a GIL held for milliseconds by another thread, a starved CPU) shows up as lag here, and
as a stall in every stream of that process. Each wake-up is one sample of what any ready callback
waits at that moment; the period is drawn uniformly from [0.5, 1.5) x PERIOD_S, so the samples
fall at random phases of whatever periodic work holds the loop instead of locking onto it, and
a stall longer than 1.5 x PERIOD_S is always seen. At 10 samples a second a scrape every 15 s
holds about 150 of them.

It samples only while the worker has requests in flight (`request_started` /
`request_finished`, called by the metrics' endpoint wrapper): an idle worker's loop has no
timer to wake it (a 5 ms ticker cost an idle worker 0.03 cores here; lag with nothing to stream
delays nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Callable, Optional

PERIOD_S = 0.1


class LoopLagMonitor:
    """`start()` on the loop to watch; `observe` gets each sample's lag in seconds."""

    def __init__(self, observe: Callable[[float], None], period_s: float = PERIOD_S,
                 draw: Callable[[], float] = random.random) -> None:
        self._observe = observe
        self._period_s = period_s
        self._draw = draw
        self._in_flight = 0
        self._busy: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._busy = asyncio.Event()
            if self._in_flight:
                self._busy.set()
            self._task = asyncio.get_running_loop().create_task(self._tick(), name="loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request_started(self) -> None:
        """On the loop: one more request in flight (the first wakes the sampler)."""
        self._in_flight += 1
        if self._in_flight == 1 and self._busy is not None:
            self._busy.set()

    def request_finished(self) -> None:
        """On the loop: one request fewer (the last puts the sampler to sleep)."""
        self._in_flight = max(0, self._in_flight - 1)
        if self._in_flight == 0 and self._busy is not None:
            self._busy.clear()

    async def _tick(self) -> None:
        busy, observe = self._busy, self._observe
        assert busy is not None
        while True:
            await busy.wait()
            period = self._period_s * (0.5 + self._draw())
            start = time.monotonic()
            await asyncio.sleep(period)
            observe(max(0.0, time.monotonic() - start - period))
