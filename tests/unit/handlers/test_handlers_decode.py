"""DecodeHandler with fakes: aggregated and disaggregated branches, validation, bounded waits,
prefill failure, cancellation before the first token."""

import asyncio

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.disagg.orchestration import Orchestration
from handlers.core.errors import EngineError, PrefillError, PrefillUnavailable, RequestError
from tests.support.handler_fakes import (
    BOOT,
    FakeContext,
    FakeEngine,
    FakePrefillClient,
    chunk,
    collect,
    wait_until,
)

pytestmark = pytest.mark.timeout(10)

AGG = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                   orchestration=Orchestration.NONE)
DISAGG = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                      orchestration=Orchestration.DECODE, bootstrap_timeout_s=0.3,
                      first_token_timeout_s=5)
REQUEST = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 3},
           "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2]}
CHUNKS = [chunk([10], completion=1), chunk([11], completion=2),
          chunk([12], {"type": "length", "length": 3}, prompt=3, completion=3)]
DONE = {"finished": True, "prompt_tokens": 3, "cached_tokens": 0}


def ok_prefill(done: bool = True):
    async def items(request):
        yield dict(BOOT)
        if not done:  # prefill still busy (until the linked context cancels it)
            await asyncio.Event().wait()
        yield dict(DONE)
    return FakePrefillClient(items)


async def test_aggregated_tokens_stream():
    engine = FakeEngine(CHUNKS)
    out = await collect(DecodeHandler(engine, AGG).generate(REQUEST, FakeContext()))
    assert [d["token_ids"] for d in out] == [[10], [11], [12]]
    assert out[-1]["finish_reason"] == "length"
    assert out[-1]["completion_usage"]["completion_tokens"] == 3
    call = engine.calls[0]
    assert call["input_ids"] == [1, 2, 3] and call["stream"] is True
    assert call["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.0}
    assert "bootstrap_room" not in call
    assert engine.aborts == []


async def test_each_request_gets_its_own_rid():
    engine = FakeEngine(CHUNKS)
    handler = DecodeHandler(engine, AGG)
    for _ in range(3):
        await collect(handler.generate(REQUEST, FakeContext()))
    rids = [c["rid"] for c in engine.calls]
    assert len(set(rids)) == 3 and all(len(r.split("-")[-1]) == 32 for r in rids)


@pytest.mark.parametrize("patch, message", [
    ({"token_ids": [1, 100]}, "token_ids[1]: token id 100 is out of vocabulary (vocab size 100)"),
    ({"token_ids": [1, -1]}, "token_ids[1]: must be >= 0"),
    ({"token_ids": list(range(64))}, "prompt is too long: 64 tokens, the model's context length "
                                     "is 64 tokens"),
    ({"stop_conditions": {"max_tokens": -1}}, "stop_conditions.max_tokens: must be >= 1"),
    ({"sampling_options": {"temperature": -2}}, "sampling_options.temperature: must be >= 0"),
])
async def test_bad_requests_are_request_errors(patch, message):
    engine = FakeEngine(CHUNKS)
    with pytest.raises(RequestError) as info:
        await collect(DecodeHandler(engine, AGG).generate({**REQUEST, **patch}, FakeContext()))
    assert str(info.value).startswith(message)
    assert engine.calls == []


async def test_disagg_n2_sends_n_to_prefill_and_runs_one_engine_request_in_its_room():
    engine = FakeEngine(CHUNKS)
    prefill = ok_prefill()
    req = {**REQUEST, "sampling_options": {"n": 2}}
    await collect(DecodeHandler(engine, DISAGG, prefill).generate(req, FakeContext()))
    assert prefill.requests[0]["sampling_params"]["n"] == 2
    assert len(engine.calls) == 1 and engine.calls[0]["sampling_params"]["n"] == 2
    assert engine.calls[0]["bootstrap_room"] == BOOT["bootstrap_room"]


async def test_disagg_flow_sends_ids_and_uses_the_bootstrap_triple():
    engine = FakeEngine(CHUNKS)
    prefill = ok_prefill()
    handler = DecodeHandler(engine, DISAGG, prefill)
    ctx = FakeContext()
    out = await collect(handler.generate(REQUEST, ctx))
    assert [d["token_ids"] for d in out] == [[10], [11], [12]]
    sent = prefill.requests[0]
    assert sent["request"]["token_ids"] == [1, 2, 3]
    assert sent["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.0}
    assert prefill.contexts[0] is ctx  # the component links a child of this context
    call = engine.calls[0]
    assert {k: call[k] for k in BOOT} == BOOT
    await wait_until(lambda: prefill.closed.is_set() and handler.running_tasks == 0)


async def test_bootstrap_wait_is_bounded():
    async def silent(request):
        await asyncio.Event().wait()
        yield {}

    engine = FakeEngine(CHUNKS)
    prefill = FakePrefillClient(silent)
    handler = DecodeHandler(engine, DISAGG, prefill)
    started = asyncio.get_running_loop().time()
    with pytest.raises(PrefillUnavailable, match="prefill worker did not respond within 0.3 s"):
        await collect(handler.generate(REQUEST, FakeContext()))
    assert asyncio.get_running_loop().time() - started < 2
    assert engine.calls == []
    await wait_until(lambda: prefill.closed.is_set())


@pytest.mark.parametrize("first", [
    {"error": "no capacity"}, {"bootstrap_host": "h"}, None,
    {**BOOT, "bootstrap_host": "*"}, {**BOOT, "bootstrap_host": "bad host"},
    {**BOOT, "bootstrap_host": "0.0.0.0"}, {**BOOT, "bootstrap_port": 70000},
])
async def test_bad_first_prefill_item_fails_the_request_alone(first):
    """Also a malformed bootstrap host or port: that request fails with a message naming the
    field, the engine never sees it, the prefill is stopped, and the next request is served."""
    async def items(request):
        if len(prefill.requests) == 1:  # the first request gets the bad item
            if first is not None:
                yield first
            return
        yield dict(BOOT)
        yield {"finished": True}

    engine, prefill = FakeEngine(CHUNKS), FakePrefillClient(items)
    handler = DecodeHandler(engine, DISAGG, prefill)
    with pytest.raises(PrefillError) as info:
        await collect(handler.generate(REQUEST, FakeContext()))
    if first and "bootstrap_port" in first and first != {"bootstrap_host": "h"}:
        field = "bootstrap_host" if first["bootstrap_port"] == BOOT["bootstrap_port"] else (
            "bootstrap_port")
        assert f"bad bootstrap info: {field}: " in str(info.value)
    assert engine.calls == []
    await wait_until(lambda: prefill.closed.is_set())
    assert len(await collect(handler.generate(REQUEST, FakeContext()))) == len(CHUNKS)


async def test_prefill_failure_aborts_the_decode_engine_and_errors():
    release = asyncio.Event()

    async def items(request):
        yield dict(BOOT)
        await release.wait()
        raise ConnectionError("prefill worker died")

    engine = FakeEngine(hold=True)  # waits for KV that never comes
    handler = DecodeHandler(engine, DISAGG, FakePrefillClient(items))
    task = asyncio.ensure_future(collect(handler.generate(REQUEST, FakeContext())))
    await wait_until(lambda: engine.calls)
    release.set()
    with pytest.raises(PrefillError, match="prefill worker died"):
        await asyncio.wait_for(task, 5)
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_prefill_ending_without_done_before_kv_is_a_failure():
    async def items(request):
        yield dict(BOOT)

    engine = FakeEngine(hold=True)
    with pytest.raises(PrefillError, match="ended before its engine finished"):
        await collect(DecodeHandler(engine, DISAGG, FakePrefillClient(items)).generate(
            REQUEST, FakeContext()))
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_prefill_failure_after_first_token_is_harmless():
    gate = asyncio.Event()

    async def items(request):
        yield dict(BOOT)
        await gate.wait()
        raise ConnectionError("late")

    class GatedEngine(FakeEngine):
        async def _stream(self, aborted):
            yield CHUNKS[0]
            gate.set()
            await asyncio.sleep(0.05)  # let the prefill watcher see its failure
            for c in CHUNKS[1:]:
                yield c

    engine = GatedEngine()
    out = await collect(DecodeHandler(engine, DISAGG, FakePrefillClient(items)).generate(
        REQUEST, FakeContext()))
    assert [d["token_ids"] for d in out] == [[10], [11], [12]]
    assert engine.aborts == []


async def test_cancel_before_first_token_aborts_the_engine_rid():
    engine = FakeEngine(hold=True)
    ctx = FakeContext()
    handler = DecodeHandler(engine, AGG)
    task = asyncio.ensure_future(collect(handler.generate(REQUEST, ctx)))
    await wait_until(lambda: engine.calls)
    ctx.stop()
    assert await asyncio.wait_for(task, 5) == []
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_cancel_before_first_token_in_disagg():
    engine = FakeEngine(hold=True)
    ctx = FakeContext()
    handler = DecodeHandler(engine, DISAGG, ok_prefill(done=False))
    task = asyncio.ensure_future(collect(handler.generate(REQUEST, ctx)))
    await wait_until(lambda: engine.calls)
    ctx.stop()
    assert await asyncio.wait_for(task, 5) == []
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_cancel_mid_stream_stops_yielding_and_aborts():
    engine = FakeEngine([chunk([10]), chunk([11])], hold=True)
    ctx = FakeContext()
    stream = DecodeHandler(engine, AGG).generate(REQUEST, ctx)
    assert (await anext(stream))["token_ids"] == [10]
    ctx.stop()
    rest = await collect(stream)
    assert rest == []
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_closing_the_generator_aborts():
    engine = FakeEngine([chunk([10])], hold=True)
    stream = DecodeHandler(engine, AGG).generate(REQUEST, FakeContext())
    await anext(stream)
    await stream.aclose()
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_first_token_wait_is_bounded():
    engine = FakeEngine(hold=True)
    config = DecodeConfig(served_model_name="t", context_length=64, vocab_size=100,
                          orchestration=Orchestration.NONE, first_token_timeout_s=0.2)
    with pytest.raises(EngineError, match="no first token within 0.2 s"):
        await collect(DecodeHandler(engine, config).generate(REQUEST, FakeContext()))
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_engine_abort_400_is_a_request_error():
    abort = {"type": "abort", "message": "bad grammar", "status_code": 400}
    engine = FakeEngine([chunk([], abort)])
    with pytest.raises(RequestError, match="bad grammar"):
        await collect(DecodeHandler(engine, AGG).generate(REQUEST, FakeContext()))


def test_constructor_checks_its_dependencies():
    with pytest.raises(ValueError, match="prefill client"):
        DecodeHandler(FakeEngine(), DISAGG)
    text = DecodeConfig(served_model_name="t", context_length=8, vocab_size=8,
                        orchestration=Orchestration.NONE, skip_tokenizer_init=False)
    with pytest.raises(ValueError, match="preprocessor"):
        DecodeHandler(FakeEngine(), text)


async def test_health_payload_is_a_valid_request():
    from handlers import decode_health_payload

    engine = FakeEngine([chunk([5], {"type": "length"}, completion=1)])
    out = await collect(DecodeHandler(engine, AGG).generate(decode_health_payload(1, False), None))
    assert out[-1]["token_ids"] == [5]
    assert engine.calls[0]["sampling_params"]["max_new_tokens"] == 1
