"""PrefillHandler: bootstrap info first, engine started before that yield, stream open until
the engine is done, abort on cancel, errors raised."""

import asyncio
import dataclasses

import pytest

from handlers import FAKE_BOOTSTRAP_HOST, PrefillConfig, PrefillHandler, prefill_health_payload
from handlers.disagg.orchestration import Orchestration
from handlers.core.errors import EngineError, RequestError
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect, wait_until

pytestmark = pytest.mark.timeout(10)

CONFIG = PrefillConfig(bootstrap_host="127.0.0.1", bootstrap_port=18998,
                       orchestration=Orchestration.DECODE)
REQUEST = {"request": {"token_ids": [1, 2, 3, 4]},
           "sampling_params": {"max_new_tokens": 5, "temperature": 0.0}}
DONE = chunk([9], {"type": "length", "length": 1}, prompt=4, completion=1, cached=2)


async def test_bootstrap_first_engine_started_before_it_and_stream_open_until_done():
    gate = asyncio.Event()
    engine = FakeEngine([DONE], gate=gate)
    handler = PrefillHandler(engine, CONFIG)
    stream = handler.generate(REQUEST, FakeContext())

    first = await asyncio.wait_for(anext(stream), 5)
    assert len(engine.calls) == 1, "engine must be started before the bootstrap yield"
    assert first["bootstrap_host"] == "127.0.0.1" and first["bootstrap_port"] == 18998
    assert 1 <= first["bootstrap_room"] < 2**63
    call = engine.calls[0]
    assert call["input_ids"] == [1, 2, 3, 4] and call["stream"] is True
    assert call["bootstrap_room"] == first["bootstrap_room"]
    assert call["sampling_params"] == REQUEST["sampling_params"]

    pending = asyncio.ensure_future(anext(stream))
    done, _ = await asyncio.wait({pending}, timeout=0.2)
    assert not done, "the stream must stay open while the engine works"
    gate.set()
    last = await asyncio.wait_for(pending, 5)
    assert last == {"finished": True, "prompt_tokens": 4, "cached_tokens": 2}
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert engine.aborts == []


async def test_rooms_and_rids_are_fresh_per_request():
    engine = FakeEngine([DONE])
    handler = PrefillHandler(engine, CONFIG)
    rooms = [(await collect(handler.generate(REQUEST, FakeContext())))[0]["bootstrap_room"]
             for _ in range(5)]
    assert len(set(rooms)) == 5
    assert len({c["rid"] for c in engine.calls}) == 5


async def test_n_reaches_the_engine_in_the_one_room():
    """The engine prefills the prompt once for every choice (one room; the CPU engine samples
    each choice's first token, the SGLang adapter derives a room per choice from it)."""
    engine = FakeEngine([DONE])
    req = {**REQUEST, "sampling_params": {"n": 3, "max_new_tokens": 2}}
    out = await collect(PrefillHandler(engine, CONFIG).generate(req, FakeContext()))
    assert engine.calls[0]["sampling_params"] == {"n": 3, "max_new_tokens": 2}
    assert len(engine.calls) == 1 and engine.calls[0]["bootstrap_room"] == out[0]["bootstrap_room"]


async def test_cancel_aborts_the_engine_request_and_ends_quietly():
    engine = FakeEngine(hold=True)
    ctx = FakeContext()
    handler = PrefillHandler(engine, CONFIG)
    stream = handler.generate(REQUEST, ctx)
    await asyncio.wait_for(anext(stream), 5)
    ctx.stop()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
    assert engine.aborts == [engine.calls[0]["rid"]]
    await wait_until(lambda: handler.running_tasks == 0)


async def test_closing_the_stream_early_aborts():
    engine = FakeEngine(hold=True)
    handler = PrefillHandler(engine, CONFIG)
    stream = handler.generate(REQUEST, FakeContext())
    await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_engine_abort_without_client_stop_is_an_error():
    engine = FakeEngine([chunk([], {"type": "abort", "message": "kv transfer failed"})])
    stream = PrefillHandler(engine, CONFIG).generate(REQUEST, FakeContext())
    await asyncio.wait_for(anext(stream), 5)
    with pytest.raises(EngineError, match="aborted"):
        await asyncio.wait_for(anext(stream), 5)


async def test_engine_abort_with_status_raises():
    engine = FakeEngine([chunk([], {"type": "abort", "message": "boom", "status_code": 500})])
    stream = PrefillHandler(engine, CONFIG).generate(REQUEST, FakeContext())
    await anext(stream)
    with pytest.raises(EngineError, match="status 500"):
        await asyncio.wait_for(anext(stream), 5)


async def test_engine_timeout_is_bounded():
    engine = FakeEngine(hold=True)
    handler = PrefillHandler(engine, PrefillConfig("h", 1, Orchestration.DECODE,
                                                   engine_timeout_s=0.2))
    stream = handler.generate(REQUEST, FakeContext())
    await anext(stream)
    with pytest.raises(EngineError, match="within 0.2 s"):
        await asyncio.wait_for(anext(stream), 5)
    assert engine.aborts == [engine.calls[0]["rid"]]
    await wait_until(lambda: handler.running_tasks == 0)


@pytest.mark.parametrize("bad, message", [
    ({"request": {"messages": [{"role": "user", "content": "x"}]}},
     "request.token_ids: is required"),
    ({"request": {"token_ids": [-1]}}, "request.token_ids[0]: must be >= 0"),
])
async def test_bad_request_is_a_request_error(bad, message):
    engine = FakeEngine([DONE])
    with pytest.raises(RequestError) as info:
        await collect(PrefillHandler(engine, CONFIG).generate(bad, FakeContext()))
    assert str(info.value) == message
    assert engine.calls == []


@pytest.mark.parametrize("style", [Orchestration.DECODE, Orchestration.FRONTEND])
async def test_health_check_uses_the_fake_bootstrap_host_and_yields_only_done(style):
    """The canary is decode's shape in both styles (handlers/core/health.py)."""
    engine = FakeEngine([DONE])
    config = dataclasses.replace(CONFIG, orchestration=style)
    out = await collect(PrefillHandler(engine, config).generate(prefill_health_payload(1), None))
    assert out == [{"finished": True, "prompt_tokens": 4, "cached_tokens": 2}]
    assert engine.calls[0]["bootstrap_host"] == FAKE_BOOTSTRAP_HOST


FLAT = {"token_ids": [1, 2, 3, 4], "stop_conditions": {"max_tokens": 1}}


@pytest.mark.parametrize("style, request_, words", [
    (Orchestration.DECODE, FLAT, "decode-orchestrated .* got a flat preprocessed request"),
    (Orchestration.FRONTEND, REQUEST, "frontend-orchestrated .* got a decode worker's"),
    (Orchestration.DECODE, [1, 2], "must be an object"),
])
async def test_the_other_styles_request_shape_is_a_request_error_naming_the_style(
        style, request_, words):
    engine = FakeEngine([DONE])
    config = dataclasses.replace(CONFIG, orchestration=style)
    with pytest.raises(RequestError, match=words):
        await collect(PrefillHandler(engine, config).generate(request_, FakeContext()))
    assert engine.calls == []


def test_a_prefill_config_is_disaggregated():
    with pytest.raises(ValueError, match="frontend or decode"):
        PrefillConfig("h", 1, Orchestration.NONE)


async def test_cleanup_cancels_tracked_tasks():
    engine = FakeEngine(hold=True)
    handler = PrefillHandler(engine, CONFIG)
    stream = handler.generate(REQUEST, FakeContext())
    await anext(stream)
    assert handler.running_tasks == 1
    await handler.cleanup()
    assert handler.running_tasks == 0
    with pytest.raises(EngineError, match="shutting down"):
        await asyncio.wait_for(anext(stream), 5)
