"""`components/worker/metrics/loop_lag.py`: no timer while idle; with a request in flight, a loop
held by a blocking call shows up as lag; the last request's end and `stop` end the sampling."""

import asyncio
import time

from components.worker.metrics.loop_lag import LoopLagMonitor

PERIOD_S = 0.002


async def wait_for_samples(lags: list[float], count: int) -> None:
    for _ in range(500):  # bounded: 1 s
        if len(lags) >= count:
            return
        await asyncio.sleep(PERIOD_S)
    raise AssertionError(f"{len(lags)} samples, expected {count}")


def test_samples_only_while_requests_are_in_flight():
    lags: list[float] = []

    async def run() -> None:
        monitor = LoopLagMonitor(lags.append, period_s=PERIOD_S, draw=lambda: 0.5)
        monitor.start()
        await asyncio.sleep(20 * PERIOD_S)
        assert lags == []  # idle: the sampler never woke
        monitor.request_started()
        monitor.request_started()
        await wait_for_samples(lags, 3)
        before = len(lags)
        time.sleep(0.05)  # holds the loop, as a tokenization on the loop would
        await wait_for_samples(lags, before + 1)
        assert max(lags[before:]) >= 0.03  # the sample woke at least 30 ms late
        monitor.request_finished()
        await wait_for_samples(lags, len(lags) + 1)  # one request still in flight
        monitor.request_finished()
        await asyncio.sleep(3 * PERIOD_S)  # a sleep already under way may still end
        count = len(lags)
        await asyncio.sleep(20 * PERIOD_S)
        assert len(lags) == count  # idle again: no more wake-ups
        monitor.request_started()
        await wait_for_samples(lags, count + 1)
        await monitor.stop()
        count = len(lags)
        await asyncio.sleep(10 * PERIOD_S)
        assert len(lags) == count  # stopped

    asyncio.run(asyncio.wait_for(run(), 10))

