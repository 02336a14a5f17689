"""The handlers' side of the room watch, with fakes: a frontend-orchestrated prefill leg stops
as soon as its decode half ends (and never starts when it already has), a decode refusal is the
same 400 from the prefill, and the decode half claims its room before anything else and says
how it ended."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from handlers import DecodeConfig, DecodeHandler, PrefillConfig, PrefillHandler
from handlers.core.errors import RequestError
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import (
    FakeContext, FakeEngine, FakePrefillClient, chunk, collect, wait_until,
)
from tests.unit.handlers.test_frontend_disagg import BOOT, DECODE_REQ, FLAT

pytestmark = pytest.mark.timeout(10)

CONFIG = PrefillConfig(bootstrap_host="127.0.0.1", bootstrap_port=18998,
                       orchestration=Orchestration.FRONTEND)
DECODE_STYLE = dataclasses.replace(CONFIG, orchestration=Orchestration.DECODE)
ROOM = BOOT["bootstrap_room"]


class FakeWatch:
    def __init__(self) -> None:
        self.legs: dict[int, asyncio.Future] = {}
        self.unwatched: list[int] = []

    def watch(self, room: int) -> asyncio.Future:
        return self.legs.setdefault(room, asyncio.get_running_loop().create_future())

    def unwatch(self, room: int, gone: asyncio.Future) -> None:
        self.unwatched.append(room)

    def end(self, outcome: str, message: str = "") -> None:
        self.legs[ROOM].set_result(SimpleNamespace(room=ROOM, outcome=outcome, message=message))


async def test_a_leg_whose_decode_half_ended_computes_nothing():
    watch, engine = FakeWatch(), FakeEngine(hold=True)
    watch.watch(ROOM)
    watch.end("cancelled")
    assert await collect(PrefillHandler(engine, CONFIG, rooms=watch).generate(FLAT)) == []
    assert engine.calls == [] and watch.unwatched == [ROOM]


async def test_a_decode_refusal_is_the_same_400_from_the_prefill():
    watch, engine = FakeWatch(), FakeEngine(hold=True)
    watch.watch(ROOM)
    watch.end("invalid", "prompt is too long: 70 tokens")
    with pytest.raises(RequestError, match="prompt is too long: 70 tokens"):
        await collect(PrefillHandler(engine, CONFIG, rooms=watch).generate(FLAT))
    assert engine.calls == []


async def test_the_decode_half_ending_mid_prefill_aborts_it_and_ends_quietly():
    watch, engine = FakeWatch(), FakeEngine(hold=True)
    stream = PrefillHandler(engine, CONFIG, rooms=watch).generate(FLAT, FakeContext())
    first = await asyncio.wait_for(anext(stream), 5)
    assert first["disaggregated_params"]["bootstrap_room"] == ROOM
    watch.end("failed", "the decode worker's room-watch connection dropped")
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
    assert engine.aborts == [engine.calls[0]["rid"]]


async def test_a_decode_orchestrated_leg_watches_the_room_it_draws():
    watch, engine = FakeWatch(), FakeEngine(hold=True)
    wrapped = {"request": {"token_ids": [1, 2, 3]}, "sampling_params": {"max_new_tokens": 1}}
    stream = PrefillHandler(engine, DECODE_STYLE, rooms=watch).generate(wrapped, FakeContext())
    first = await asyncio.wait_for(anext(stream), 5)
    assert list(watch.legs) == [first["bootstrap_room"]]
    watch.legs[first["bootstrap_room"]].set_result(
        SimpleNamespace(room=first["bootstrap_room"], outcome="cancelled", message=""))
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 5)
    assert engine.aborts == [engine.calls[0]["rid"]]


class FakeClaims:
    def __init__(self) -> None:
        self.claimed: list[tuple] = []
        self.released: list[tuple] = []

    async def claim(self, host: str, port: int, room: int):
        self.claimed.append((host, port, room))
        return SimpleNamespace(release=lambda outcome, message="":
                               self.released.append((outcome, message)))


DECODE = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                      orchestration=Orchestration.FRONTEND)
TWO = chunk([5, 6], {"type": "length", "length": 2}, prompt=3, completion=2)


async def test_the_decode_half_claims_its_room_and_releases_it_done():
    claims = FakeClaims()
    handler = DecodeHandler(FakeEngine([TWO]), DECODE, rooms=claims)
    await collect(handler.generate({**DECODE_REQ, "bootstrap_info": BOOT}, FakeContext()))
    assert claims.claimed == [(BOOT["bootstrap_host"], BOOT["bootstrap_port"], ROOM)]
    assert claims.released == [("done", "")]


async def test_a_refused_decode_half_releases_its_room_invalid_with_the_message():
    claims = FakeClaims()
    handler = DecodeHandler(FakeEngine([TWO]), DECODE, rooms=claims)
    with pytest.raises(RequestError) as refused:
        await collect(handler.generate({**DECODE_REQ, "token_ids": [1] * 70,
                                        "bootstrap_info": BOOT}, FakeContext()))
    assert claims.released == [("invalid", str(refused.value))]


async def test_a_client_that_leaves_releases_the_room_cancelled():
    claims, ctx = FakeClaims(), FakeContext()
    handler = DecodeHandler(FakeEngine(hold=True), DECODE, rooms=claims)
    stream = handler.generate({**DECODE_REQ, "bootstrap_info": BOOT}, ctx)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    ctx.stop()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 5)
    assert claims.released == [("cancelled", "")]


async def test_a_stream_the_runtime_closes_releases_the_room_cancelled():
    """Dynamo closes a handler's stream when its client disconnects: the half was cancelled (as
    the worker's metrics count it), not failed."""
    claims = FakeClaims()
    handler = DecodeHandler(FakeEngine([chunk([5], completion=1)], hold=True), DECODE,
                            rooms=claims)
    stream = handler.generate({**DECODE_REQ, "bootstrap_info": BOOT}, FakeContext())
    await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    assert claims.released == [("cancelled", "")]


async def test_a_decode_orchestrated_half_claims_the_room_its_prefill_names():
    async def items(request):
        yield dict(BOOT)
        await asyncio.Event().wait()  # the prefill holds its stream until its KV is written

    claims, ctx = FakeClaims(), FakeContext()
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                          orchestration=Orchestration.DECODE)
    handler = DecodeHandler(FakeEngine(hold=True), config, FakePrefillClient(items),
                            rooms=claims)
    pending = asyncio.ensure_future(anext(handler.generate(DECODE_REQ, ctx)))
    await wait_until(lambda: claims.claimed)
    assert claims.claimed == [(BOOT["bootstrap_host"], BOOT["bootstrap_port"], ROOM)]
    ctx.stop()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 5)
    assert claims.released == [("cancelled", "")]
