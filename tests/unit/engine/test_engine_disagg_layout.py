"""Finding 7 of issue 9 at engine level: a prefill engine and a decode engine whose KV layouts
differ (bf16 vs fp16: the same bytes per token) refuse each other with a clear error instead
of decoding from garbage; both KV pools end empty."""

import asyncio
import time

import pytest
import pytest_asyncio

from components.engine.process.engine import CpuEngine
from harness.engine_proc import EngineProcess
from tests.support.engine_helpers import boot, wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

TIMEOUTS = {"bootstrap_timeout": 2.0, "transfer_timeout": 5.0}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prefill(tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, disaggregation_mode="prefill",
                                     disaggregation_bootstrap_port=0, dtype="bfloat16",
                                     **TIMEOUTS)
    yield proc
    await proc.close()


@pytest.fixture(scope="module")
def decode(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, disaggregation_mode="decode", dtype="float16",
                    **TIMEOUTS)
    yield eng
    eng.shutdown()


async def test_dtype_mismatch_fails_the_request_naming_both_layouts(prefill, decode):
    ids, params = [1, 2, 3, 4, 5], {"temperature": 0.0, "max_new_tokens": 4}
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=params, **b))
    d = await asyncio.wait_for(decode.async_generate(input_ids=ids, sampling_params=params, **b),
                               10)
    reason = d["meta_info"]["finish_reason"]
    assert reason["type"] == "abort", d
    assert "KV layout mismatch" in reason["message"], reason
    assert "bfloat16" in reason["message"] and "float16 layers" in reason["message"], reason
    p = await asyncio.wait_for(p_task, 10)  # nobody registered the room: bootstrap timeout
    assert p["meta_info"]["finish_reason"]["type"] == "abort"
    await wait_until(lambda: decode.kv_pages_in_use() == 0, what="decode pool empty")
    deadline = time.monotonic() + 10
    while (pages := await prefill.pages_in_use()) != 0:
        assert time.monotonic() < deadline, f"prefill still holds {pages} pages"
        await asyncio.sleep(0.05)
