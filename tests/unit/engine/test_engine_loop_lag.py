"""The embedding process's asyncio loop stays responsive while the engine thread prefills.

The precise lag figures belong in benchmarks/bench_engine.py; this asserts the bound with margin
(the requirement is p99 < 10 ms; unloaded it measures well under 1 ms).
"""

import asyncio
import time

import pytest

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import random_prompt

TICK_S = 0.001
P99_BOUND_MS = 10.0


@pytest.mark.slow
async def test_loop_lag_during_long_prefill(small_model_path):
    eng = CpuEngine(model_path=small_model_path, max_total_tokens=4096)
    try:
        ids = random_prompt(2000, eng.vocab_size, seed=3)
        # Warm-up, so one-time costs (first forward, allocator growth) are not measured.
        await eng.async_generate(input_ids=ids[:64], sampling_params={"max_new_tokens": 1})
        lags: list[float] = []
        done = asyncio.Event()

        async def ticker():
            while not done.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(TICK_S)
                lags.append((time.perf_counter() - t0 - TICK_S) * 1e3)

        tick = asyncio.create_task(ticker())
        t0 = time.perf_counter()
        out = await eng.async_generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
        prefill_s = time.perf_counter() - t0
        done.set()
        await asyncio.wait_for(tick, 5)
        assert len(out["output_ids"]) == 1
        assert prefill_s > 0.1, "prefill too short to say anything about loop lag"
        lags.sort()
        p99 = lags[int(0.99 * (len(lags) - 1))]
        stats = f"{len(lags)} ticks in {prefill_s:.2f} s, p99 {p99:.2f} ms, max {lags[-1]:.2f} ms"
        assert len(lags) >= 50, stats  # a blocked loop would tick once, late
        assert p99 < P99_BOUND_MS, stats
    finally:
        eng.shutdown()
