"""CPU engine request lifecycle: bad input, aborts, cancellation, queueing, shutdown."""

import asyncio

import pytest

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import (
    assert_chunk_shape, drain, load_reference, random_prompt, reference_greedy, wait_until,
)

# max_new_tokens None: up to the context (an explicit count past it is refused, as SGLang does).
LONG = {"temperature": 0.0, "max_new_tokens": None, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, context_length=4096, max_total_tokens=16384)
    yield eng
    eng.shutdown()


def _abort_reason(chunk):
    reason = chunk["meta_info"]["finish_reason"]
    assert reason is not None and reason["type"] == "abort", reason
    return reason


@pytest.mark.parametrize("kwargs, needle", [
    ({"input_ids": [1, 2, 5000]}, "out of the vocabulary"),
    ({"input_ids": [1, -3]}, "out of the vocabulary"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": list(range(3, 1003)) * 5}, "longer than the model's context length"),
    ({}, "should be provided"),
    ({"prompt": 123}, "prompt must be a string"),
    ({"input_ids": "1 2 3"}, "must be a list"),
    ({"input_ids": [1, 2.5]}, "must hold integers"),
    ({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}, "top_k"),
    ({"input_ids": [1, 2], "sampling_params": {"n": 0}}, "n must be at least 1"),
    ({"input_ids": [1, 2], "sampling_params": {"n": 5, "max_new_tokens": 4000}},
     r"KV space for 20010 tokens \(5 choices of 4002\)"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 20000}},
     "exceeds the model's maximum context length of 4096 tokens"),
])
async def test_bad_input_raises_value_error_like_sglang(engine, kwargs, needle):
    """SGLang raises ValueError for a request it refuses: from the awaited call, or on the
    stream's first read (nothing is sent before it)."""
    with pytest.raises(ValueError, match=needle):
        await engine.async_generate(**kwargs)
    stream = await engine.async_generate(**kwargs, stream=True)
    with pytest.raises(ValueError, match=needle):
        await stream.__anext__()
    assert engine.kv_pages_in_use() == 0


async def test_a_stream_is_sent_on_its_first_read(engine):
    """As SGLang: an abort before the first read names an rid the engine does not know yet."""
    params = {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
    stream = await engine.async_generate(input_ids=[5, 6], sampling_params=params, stream=True,
                                         rid="not-sent-yet")
    engine.tokenizer_manager.abort_request("not-sent-yet")
    chunks = await asyncio.wait_for(drain(stream), 10)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


async def test_abort_running_request_frees_pages(engine):
    stream = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=LONG, stream=True,
                                         rid="to-abort")
    seen = [await stream.__anext__() for _ in range(3)]
    assert engine.kv_pages_in_use() > 0
    engine.tokenizer_manager.abort_request("to-abort")
    rest = await asyncio.wait_for(drain(stream), 10)
    reason = _abort_reason(rest[-1])
    assert reason == {"type": "abort", "message": "Aborted", "status_code": None}
    assert len(seen) + len(rest) < 1000
    assert engine.kv_pages_in_use() == 0
    engine.tokenizer_manager.abort_request("to-abort")  # unknown / finished rid: no-op


async def test_closing_the_stream_aborts(engine):
    stream = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=LONG, stream=True)
    await stream.__anext__()
    await stream.aclose()
    await wait_until(lambda: engine.kv_pages_in_use() == 0, what="pages freed after aclose")


async def test_cancelling_a_non_stream_call_aborts(engine):
    task = asyncio.create_task(engine.async_generate(input_ids=[5, 6], sampling_params=LONG,
                                                     rid="cancel-me"))
    await wait_until(lambda: engine.kv_pages_in_use() > 0, what="request admitted")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: engine.kv_pages_in_use() == 0, what="pages freed after cancel")
    # The rid is reusable once the engine has ended the request.
    await wait_until(lambda: not engine.rid_in_flight("cancel-me"), what="rid released")
    out = await engine.async_generate(input_ids=[5], sampling_params={"max_new_tokens": 2},
                                      rid="cancel-me")
    assert len(out["output_ids"]) == 2


async def test_abort_all_and_duplicate_rid(engine):
    streams = [await engine.async_generate(input_ids=[5, i + 3], sampling_params=LONG,
                                           stream=True, rid=f"all-{i}") for i in range(3)]
    for s in streams:  # sent on the first read
        await s.__anext__()
    with pytest.raises(ValueError, match="Duplicate request ID"):
        await engine.async_generate(input_ids=[5], rid="all-1")
    engine.tokenizer_manager.abort_request(abort_all=True)
    for s in streams:
        chunks = await asyncio.wait_for(drain(s), 10)
        assert _abort_reason(chunks[-1])["message"] == "Aborted"
    assert engine.kv_pages_in_use() == 0


async def test_unsupported_features_raise(engine):
    with pytest.raises(ValueError, match="token_ids_logprob"):
        await engine.async_generate(input_ids=[1], token_ids_logprob=[3])
    with pytest.raises(ValueError, match="batched"):
        await engine.async_generate(prompt=["a", "b"])
    with pytest.raises(ValueError, match="rid"):
        await engine.async_generate(input_ids=[1], rid=17)


async def test_queueing_beyond_running_and_pool_limits(tiny_model_path):
    # Room for 2 running rows and ~3 requests' KV: the other requests wait their turn.
    eng = CpuEngine(model_path=tiny_model_path, max_running_requests=2, max_total_tokens=512,
                 page_size=16)
    ref = load_reference(tiny_model_path)
    try:
        reqs = [random_prompt(40 + 10 * i, eng.vocab_size, seed=i) for i in range(6)]
        outs = await asyncio.gather(*(eng.async_generate(
            input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 100})
            for ids in reqs))
        for ids, out in zip(reqs, outs):
            assert out["output_ids"] == reference_greedy(ref, ids, 100, eng.eos_token_ids)
        with pytest.raises(ValueError, match="KV pool"):
            await eng.async_generate(input_ids=list(range(3, 600)))
        assert eng.kv_pages_in_use() == 0
    finally:
        eng.shutdown()


async def test_skip_tokenizer_init(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True)
    try:
        assert eng.tokenizer_manager.tokenizer is None
        with pytest.raises(ValueError, match="skip_tokenizer_init"):
            await eng.async_generate(prompt="hello")
        chunks = await drain(await eng.async_generate(
            input_ids=[5, 6], sampling_params={"max_new_tokens": 3, "stop": "x"}, stream=True))
        for chunk in chunks:
            assert_chunk_shape(chunk, with_text=False)
        assert sum(len(c["output_ids"]) for c in chunks) == 3
    finally:
        eng.shutdown()


async def test_shutdown_ends_live_requests(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path)
    stream = await eng.async_generate(input_ids=[5, 6], sampling_params=LONG, stream=True)
    await stream.__anext__()
    eng.shutdown()
    chunks = await asyncio.wait_for(drain(stream), 10)
    assert _abort_reason(chunks[-1])["status_code"] == 503
    assert eng.kv_pages_in_use() == 0
    eng.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        await eng.async_generate(input_ids=[5])


def test_engine_usable_from_successive_event_loops(engine):
    for _ in range(2):  # each asyncio.run is a fresh loop
        out = asyncio.run(engine.async_generate(input_ids=[5, 6],
                                                sampling_params={"max_new_tokens": 3}))
        assert len(out["output_ids"]) == 3


def test_startup_failure_is_loud(tmp_path):
    with pytest.raises((RuntimeError, OSError, ValueError)):
        CpuEngine(model_path=str(tmp_path / "missing"))


def test_sync_generate(engine):
    params = {"max_new_tokens": 4, "temperature": 0.0}
    out = engine.generate(input_ids=[5, 6], sampling_params=params)
    assert len(out["output_ids"]) == 4
    chunks = list(engine.generate(input_ids=[5, 6], sampling_params=params, stream=True))
    assert [t for c in chunks for t in c["output_ids"]] == out["output_ids"]


async def test_sync_generate_refuses_inside_a_loop(engine):
    with pytest.raises(RuntimeError, match="async_generate"):
        engine.generate(input_ids=[5])
