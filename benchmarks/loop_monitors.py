"""What shares the event loop with a preprocessing job, and is measured while it runs: a loop-lag
ticker, a short stream fed from another thread, and a loop-side tokenizer call."""

from __future__ import annotations

import asyncio
import threading
import time

from benchmarks.common import percentile

STREAM_PERIOD_S = 0.005
PROBE_PERIOD_S = 0.005


class Monitors:
    """Loop-lag ticker, a thread-fed short stream and a loop-side tokenizer probe."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.lags: list[tuple[float, float]] = []  # (end time, lag s)
        self.gaps: list[tuple[float, float]] = []  # (arrival time, gap s)
        self.probes: list[tuple[float, float]] = []  # (end time, call s)
        self._stop = threading.Event()

    async def ticker(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            t1 = time.perf_counter()
            self.lags.append((t1, t1 - t0 - 0.001))

    async def probe(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self.tok(["a", "bb"], padding=True)
            t1 = time.perf_counter()
            self.probes.append((t1, t1 - t0))
            await asyncio.sleep(PROBE_PERIOD_S)

    async def stream(self) -> None:
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def producer() -> None:  # the engine thread's role: deliver a token every 5 ms
            while not self._stop.wait(STREAM_PERIOD_S):
                loop.call_soon_threadsafe(queue.put_nowait, time.perf_counter())

        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        last = None
        try:
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(queue.get(), 1.0)
                except asyncio.TimeoutError:
                    continue
                now = time.perf_counter()
                if last is not None:
                    self.gaps.append((now, now - last))
                last = now
        finally:
            thread.join(timeout=1.0)

    def stop(self) -> None:
        self._stop.set()


def window_stats(samples: list[tuple[float, float]], start: float, end: float) -> dict:
    """p50/p99/max (ms) of samples whose interval overlaps [start, end]."""
    values = [v * 1e3 for t, v in samples if t >= start and t - v <= end]
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "n": len(values),
    }
