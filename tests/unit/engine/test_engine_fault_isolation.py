"""One bad request never harms the others on the CPU engine: a request whose sampling
parameters overflow float32 fails alone (the batch goes on); a decode request naming a bootstrap
host no one can dial is a 400 alone; a decode that rejects a request before registering its
room stops the prefill at once instead of leaving it to wait out its bootstrap timeout."""

import asyncio
import time

import pytest
import pytest_asyncio

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import boot, drain, random_prompt, wait_until
from harness.engine_proc import EngineProcess

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

# Long enough that "stopped at once" and "waited for the timeout" cannot be confused.
TIMEOUTS = {"bootstrap_timeout": 20.0, "transfer_timeout": 20.0}
GREEDY = {"temperature": 0.0, "max_new_tokens": 40, "ignore_eos": True}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prefill(tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, disaggregation_mode="prefill",
                                     disaggregation_bootstrap_port=0, **TIMEOUTS)
    yield proc
    await proc.close()


@pytest.fixture(scope="module")
def decode(tiny_model_path):
    # A pool of 512 tokens: prompt + max_new_tokens above that is refused before registering.
    eng = CpuEngine(model_path=tiny_model_path, disaggregation_mode="decode",
                    max_total_tokens=512, **TIMEOUTS)
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_overflowing_sampling_params_fail_only_their_request(tiny_model_path, temperature):
    eng = CpuEngine(model_path=tiny_model_path)
    try:
        ids = random_prompt(30, eng.vocab_size, seed=3)
        alone = await eng.async_generate(input_ids=ids, sampling_params=GREEDY)
        good = await eng.async_generate(input_ids=ids, sampling_params=GREEDY, stream=True)
        # Accepted by SGLang's range check (0, 2], but 1/1e-40 overflows float32.
        poison = {"temperature": temperature, "repetition_penalty": 1e-40, "max_new_tokens": 20}
        with pytest.raises(ValueError, match="non-finite"):  # a 400, as SGLang raises it
            await eng.async_generate(input_ids=ids[:10], sampling_params=poison)
        chunks = await asyncio.wait_for(drain(good), 30)
        assert [t for c in chunks for t in c["output_ids"]] == alone["output_ids"]
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert eng.kv_pages_in_use() == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("host", ["*", "bad host", "0.0.0.0", "tcp://x"])
async def test_undialable_bootstrap_host_is_a_400_for_that_request_alone(prefill, decode, host):
    ids = [5, 6, 7, 8]
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=GREEDY, **b))
    good = await decode.async_generate(input_ids=ids, sampling_params=GREEDY, stream=True, **b)
    with pytest.raises(ValueError, match="bootstrap_host"):
        await decode.async_generate(input_ids=ids, sampling_params=GREEDY,
                                    **boot(prefill, bootstrap_host=host))
    chunks = await asyncio.wait_for(drain(good), 30)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    await asyncio.wait_for(p_task, 30)
    await wait_until(lambda: decode.kv_pages_in_use() == 0, what="decode pool empty")


async def test_decode_rejection_before_registering_stops_the_prefill(prefill, decode):
    ids = random_prompt(100, decode.vocab_size, seed=4)
    too_long = {"temperature": 0.0, "max_new_tokens": 1000}  # 1,100 tokens > the 512 pool
    b = boot(prefill)
    t0 = time.monotonic()
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=too_long, **b))
    with pytest.raises(ValueError, match="KV pool"):
        await decode.async_generate(input_ids=ids, sampling_params=too_long, **b)
    p = await asyncio.wait_for(p_task, 30)
    elapsed = time.monotonic() - t0
    reason = p["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "aborted by decode" in reason["message"]
    assert elapsed < TIMEOUTS["bootstrap_timeout"] / 2, f"prefill waited {elapsed:.1f} s"
    deadline = time.monotonic() + 10
    while (pages := await prefill.pages_in_use()) != 0:
        assert time.monotonic() < deadline, f"prefill still holds {pages} pages"
        await asyncio.sleep(0.05)
