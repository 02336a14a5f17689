"""`components/worker/loop_lag.py`: a loop held by a blocking call shows up as lag; stopping ends it."""

import asyncio
import time

from components.worker.loop_lag import LoopLagMonitor


def test_a_blocked_loop_is_seen_and_an_idle_one_is_not():
    lags: list[float] = []

    async def run() -> None:
        monitor = LoopLagMonitor(lags.append, period_s=0.002)
        monitor.start()
        for _ in range(200):  # bounded: a few ticks first
            if len(lags) >= 3:
                break
            await asyncio.sleep(0.002)
        idle = list(lags)
        time.sleep(0.05)  # holds the loop, as a tokenization on the loop would
        for _ in range(200):
            if len(lags) > len(idle):
                break
            await asyncio.sleep(0.002)
        await monitor.stop()
        assert len(idle) >= 3
        assert max(lags[len(idle):]) >= 0.03  # the ticker woke at least 30 ms late
        count = len(lags)
        await asyncio.sleep(0.01)
        assert len(lags) == count  # stopped: no more wake-ups

    asyncio.run(asyncio.wait_for(run(), 10))
