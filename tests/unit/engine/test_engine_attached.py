"""Tokenizer workers attached to a CPU engine in another process (``--tokenizer-worker-num``).

The engine runs in a child process with ``tokenizer_worker_num=2``; this process attaches with
``CpuEngine.attach_tokenizer_worker`` as a worker process does. Checked: the same tokens and
chunks as asking the engine directly, refusals raise the engine's ``ValueError``, a closed
stream or a killed worker process frees its KV pages, and a dead engine ends live requests.
"""

import asyncio
import subprocess
import sys
import time

import pytest
import pytest_asyncio

from components.engine.process.engine import CpuEngine
from harness.engine_proc import EngineProcess
from tests.support.engine_helpers import drain, random_prompt

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

GREEDY = {"temperature": 0.0, "max_new_tokens": 16}
LONG = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}
DEADLINE_S = 15.0
STARTUP_S = 120.0  # a fresh interpreter importing torch, on a machine the suite keeps busy


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def parent(tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, tokenizer_worker_num=2)
    yield proc
    await proc.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def attached(parent):
    eng = CpuEngine.attach_tokenizer_worker(parent.pid)
    yield eng
    eng.shutdown()


async def pages_back_to_zero(parent) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (pages := await parent.pages_in_use()) != 0:
        assert time.monotonic() < deadline, f"{pages} KV pages still in use"
        await asyncio.sleep(0.05)


async def test_attached_engine_reports_the_engines_facts(parent, attached):
    assert attached.page_size == parent.server_args["page_size"]
    assert attached.tokenizer_manager.tokenizer is not None
    assert attached.server_args.tokenizer_worker_num == 2
    assert attached.kv_pages_in_use() == 0


async def test_same_tokens_as_the_engine_itself(parent, attached):
    ids = random_prompt(40, attached.vocab_size, seed=1)
    direct = await parent.final(input_ids=ids, sampling_params=GREEDY)
    chunks = await drain(await attached.async_generate(input_ids=ids, sampling_params=GREEDY,
                                                       stream=True))
    assert sum((c["output_ids"] for c in chunks), []) == direct["output_ids"]
    final = await attached.async_generate(input_ids=ids, sampling_params=GREEDY)
    assert final["output_ids"] == direct["output_ids"]
    assert final["text"] == "".join(c["text"] for c in chunks)
    assert final["meta_info"]["finish_reason"] == direct["meta_info"]["finish_reason"]


async def test_concurrent_requests(attached):
    prompts = [random_prompt(10 + 7 * i, attached.vocab_size, seed=i) for i in range(8)]
    finals = await asyncio.gather(*(attached.async_generate(input_ids=p, sampling_params=GREEDY)
                                    for p in prompts))
    assert all(f["meta_info"]["completion_tokens"] == 16 for f in finals)


async def test_refusal_raises_the_engines_value_error(parent, attached):
    stream = await attached.async_generate(input_ids=[1, 2], stream=True,
                                           sampling_params={"temperature": -1.0})
    with pytest.raises(ValueError, match="temperature"):
        await drain(stream)
    with pytest.raises(ValueError, match="temperature"):
        await attached.async_generate(input_ids=[1, 2], sampling_params={"temperature": -1.0})
    await pages_back_to_zero(parent)


async def test_closing_the_stream_frees_its_pages(parent, attached):
    ids = random_prompt(64, attached.vocab_size, seed=3)
    stream = await attached.async_generate(input_ids=ids, sampling_params=LONG, stream=True)
    await stream.__anext__()
    assert await parent.pages_in_use() > 0
    await stream.aclose()
    await pages_back_to_zero(parent)


async def test_abort_by_rid(parent, attached):
    stream = await attached.async_generate(input_ids=[5, 6, 7], sampling_params=LONG,
                                           stream=True, rid="attached-abort")
    await stream.__anext__()
    attached.tokenizer_manager.abort_request("attached-abort")
    await pages_back_to_zero(parent)
    # The stream still being read ends with the abort, as SGLang's and CpuEngine's do (a
    # handler waiting for its next chunk is not left waiting forever).
    rest = await asyncio.wait_for(drain(stream), 10)
    assert rest[-1]["meta_info"]["finish_reason"]["type"] == "abort"


async def test_a_killed_worker_process_frees_its_pages(parent):
    script = (
        "import asyncio, sys\n"
        "from components.engine.process.engine import CpuEngine\n"
        "async def main():\n"
        f"    eng = CpuEngine.attach_tokenizer_worker({parent.pid})\n"
        f"    s = await eng.async_generate(input_ids=[3, 4, 5], sampling_params={LONG!r}, "
        "stream=True)\n"
        "    await s.__anext__()\n"
        "    print('streaming', flush=True)\n"
        "    async for _ in s: pass\n"
        "asyncio.run(main())\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), STARTUP_S)
        assert line.strip() == "streaming"
        assert await parent.pages_in_use() > 0
    finally:
        child.kill()
        child.wait(DEADLINE_S)
    await pages_back_to_zero(parent)


async def test_a_dead_engine_ends_live_requests(tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, tokenizer_worker_num=2)
    eng = CpuEngine.attach_tokenizer_worker(proc.pid)
    try:
        stream = await eng.async_generate(input_ids=[3, 4, 5], sampling_params=LONG, stream=True)
        await stream.__anext__()
        proc.kill()
        chunks = await asyncio.wait_for(drain(stream), DEADLINE_S)
        reason = chunks[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "engine process exited" in reason["message"]
        with pytest.raises(RuntimeError, match="engine process exited"):
            await eng.async_generate(input_ids=[1], sampling_params=GREEDY)
    finally:
        eng.shutdown()
        await proc.close()


async def test_n_choices_stream_and_final_like_the_engine(parent, attached):
    params = {"temperature": 0.8, "max_new_tokens": 6, "n": 3, "sampling_seed": 7}
    ids = random_prompt(20, attached.vocab_size, seed=5)
    chunks = await drain(await attached.async_generate(input_ids=ids, sampling_params=params,
                                                       stream=True))
    assert sorted({c["index"] for c in chunks}) == [0, 1, 2]
    finals = await attached.async_generate(input_ids=ids, sampling_params=params)
    assert isinstance(finals, list) and len(finals) == 3
    for i, final in enumerate(finals):
        assert final["output_ids"] == sum((c["output_ids"] for c in chunks
                                           if c["index"] == i), [])
    await pages_back_to_zero(parent)
