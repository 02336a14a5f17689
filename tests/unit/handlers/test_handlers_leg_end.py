"""`n > 1` frontend-orchestrated, in the handlers with fakes (handlers/disagg/leg_end.py): the
1.6.1 frontend ends the whole response at a finish chunk that comes before the prefill leg's
stream ended, so the prefill ends an `n > 1` leg right after its first item (a task sees the
engine request through, still stopped by the room watch) and says so over the room watch; the
decode holds its first finish chunk until then. `n = 1` legs and decodes are as before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from handlers import DecodeConfig, DecodeHandler, PrefillHandler
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect
from tests.unit.handlers.test_frontend_disagg import BOOT, DECODE_REQ, DONE, FLAT
from tests.unit.handlers.test_handlers_rooms import CONFIG, ROOM, FakeWatch

pytestmark = pytest.mark.timeout(10)

N2 = {"sampling_options": {"temperature": 0.7, "n": 2}}


class EndingWatch(FakeWatch):
    def __init__(self) -> None:
        super().__init__()
        self.ended: list[int] = []

    def leg_ended(self, room: int) -> None:
        self.ended.append(room)


async def test_an_n2_leg_ends_after_its_first_item_and_its_engine_request_goes_on():
    gate, watch = asyncio.Event(), EndingWatch()
    engine = FakeEngine([DONE], gate=gate)
    handler = PrefillHandler(engine, CONFIG, rooms=watch)
    out = await asyncio.wait_for(collect(handler.generate({**FLAT, **N2}, FakeContext())), 5)
    assert [set(item) for item in out] == [
        {"token_ids", "text", "finish_reason", "disaggregated_params"},
        {"token_ids", "engine_data"}]
    assert out[1]["engine_data"]["kv_cache_hit"] == {"prompt_tokens": 4, "reused_tokens": 0}
    # the engine is not done yet: the decode is not told until it is
    assert watch.ended == [] and watch.unwatched == []
    gate.set()
    await asyncio.wait_for(_until(lambda: watch.unwatched == [ROOM]), 5)
    assert watch.ended == [ROOM] and engine.aborts == []


async def test_a_decode_half_that_ends_still_stops_an_ended_legs_engine_request():
    watch = EndingWatch()
    engine = FakeEngine([DONE], hold=True)
    handler = PrefillHandler(engine, CONFIG, rooms=watch)
    await asyncio.wait_for(collect(handler.generate({**FLAT, **N2}, FakeContext())), 5)
    watch.end("cancelled")
    await asyncio.wait_for(_until(lambda: watch.unwatched == [ROOM]), 5)
    assert len(engine.aborts) == 1


async def test_an_n1_leg_stays_open_until_its_engine_is_done():
    gate, watch = asyncio.Event(), EndingWatch()
    stream = PrefillHandler(FakeEngine([DONE], gate=gate), CONFIG, rooms=watch).generate(
        dict(FLAT), FakeContext())
    await asyncio.wait_for(anext(stream), 5)
    nxt = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    assert not nxt.done()
    gate.set()
    assert (await nxt)["engine_data"]["kv_cache_hit"]["reused_tokens"] == 2
    assert [item async for item in stream] == [] and watch.ended == []


class Claims:
    def __init__(self) -> None:
        self.leg: asyncio.Future | None = None

    async def claim(self, host: str, port: int, room: int):
        self.leg = asyncio.get_running_loop().create_future()
        return SimpleNamespace(release=lambda outcome, message="": None,
                               leg_ended=lambda: self.leg)


def decode(engine, claims) -> DecodeHandler:
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=1000,
                          orchestration=Orchestration.FRONTEND)
    return DecodeHandler(engine, config, rooms=claims)


LENGTH = {"type": "length", "length": 2}
CHOICES = [chunk([10], completion=1), {**chunk([11], LENGTH, prompt=3, completion=2), "index": 0},
           {**chunk([12], completion=1), "index": 1},
           {**chunk([13], LENGTH, prompt=3, completion=2), "index": 1}]


async def test_the_decode_holds_its_first_finish_until_the_prefill_leg_ended():
    claims = Claims()
    stream = decode(FakeEngine(CHOICES), claims).generate(
        {**DECODE_REQ, **N2, "bootstrap_info": BOOT}, FakeContext())
    assert (await asyncio.wait_for(anext(stream), 5))["token_ids"] == [10]
    held = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    assert not held.done()  # the first finish waits for the prefill leg's end
    claims.leg.set_result(True)
    assert (await asyncio.wait_for(held, 5))["finish_reason"] == "length"
    rest = [d async for d in stream]
    assert [(d["index"], d.get("finish_reason")) for d in rest] == [(1, None), (1, "length")]


@pytest.mark.parametrize("n", [1, 2])
async def test_nothing_is_held_for_one_choice_or_a_leg_end_that_cannot_come(n):
    claims = Claims()
    handler = decode(FakeEngine(CHOICES[:2]), claims)
    body = {**DECODE_REQ, "sampling_options": {"temperature": 0.7, "n": n},
            "bootstrap_info": BOOT}
    if n == 2:
        async def closed_first():  # the room watch connection closed: no word will come
            await _until(lambda: claims.leg is not None)
            claims.leg.set_result(False)
        asyncio.ensure_future(closed_first())
    out = await asyncio.wait_for(collect(handler.generate(body, FakeContext())), 5)
    assert [d["token_ids"] for d in out] == [[10], [11]]


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)
