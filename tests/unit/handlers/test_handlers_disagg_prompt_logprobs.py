"""Prompt logprobs on a disaggregated model, in the handlers with fakes: the prefill leg asks its
engine for them (`logprob_start_len=0`) and sends what it returns to the room's decode half over
the room watch; the decode asks its engine for none, waits (bounded) for the prefill's, and
yields exactly what an aggregated worker yields for the same engine output; every way they can
fail to come is an error naming why, never an answer without them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest

from handlers import DecodeConfig, DecodeHandler, PrefillHandler
from handlers.core.errors import EngineError, PrefillError, RequestError
from handlers.disagg import prompt_logprobs
from handlers.disagg.orchestration import Orchestration
from protocol.room_watch import PromptLogprobs
from tests.support.handler_fakes import FakeContext, FakeEngine, FakePrefillClient, collect
from tests.unit.handlers.test_frontend_disagg import BOOT, DECODE_REQ, FLAT
from tests.unit.handlers.test_handlers_prompt_logprobs import final, handler as aggregated
from tests.unit.handlers.test_handlers_rooms import CONFIG, DECODE_STYLE, ROOM, FakeWatch

pytestmark = pytest.mark.timeout(10)

ASK = {"output_options": {"logprobs": 2, "prompt_logprobs": 1}}
LENGTH = {"type": "length", "length": 1}
# What the prefill sends for final()'s input logprobs (the wire drops SGLang's token text).
SENT = PromptLogprobs(ROOM, tokens=[(None, 7), (-1.5, 8), (-0.5, 9)],
                      top=[None, [(-0.7, 4), (-1.5, 8)], [(-0.5, 9), (-0.9, 3)]])


class DeliveringWatch(FakeWatch):
    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[PromptLogprobs] = []

    def deliver(self, msg: PromptLogprobs) -> None:
        self.delivered.append(msg)


class Claims:
    """A decode's room claims whose prefill sends `sent` (None: nothing, ever)."""

    def __init__(self, sent: PromptLogprobs | None) -> None:
        self.sent = sent
        self.claimed: list[int] = []

    async def claim(self, host: str, port: int, room: int):
        self.claimed.append(room)
        got = asyncio.get_running_loop().create_future()
        if self.sent is not None:
            got.set_result(self.sent)
        return SimpleNamespace(release=lambda outcome, message="": None,
                               prompt_logprobs=lambda: got)


def decode(engine, claims, orchestration=Orchestration.FRONTEND, prefill=None):
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=1000,
                          orchestration=orchestration)
    return DecodeHandler(engine, config, prefill, rooms=claims)


@pytest.mark.parametrize("config, request_", [
    (CONFIG, {**FLAT, **ASK}),
    (DECODE_STYLE, {"request": {"token_ids": [7, 8, 9], **ASK},
                    "sampling_params": {"max_new_tokens": 1}}),
], ids=["frontend-orch", "decode-orch"])
async def test_the_prefill_sends_its_engines_prompt_logprobs_to_the_rooms_decode(config,
                                                                                 request_):
    watch, engine = DeliveringWatch(), FakeEngine([final(LENGTH)])
    items = await collect(PrefillHandler(engine, config, rooms=watch).generate(request_))
    call = engine.calls[0]
    assert (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"]) == \
        (True, 2, 0)
    room = call["bootstrap_room"]
    assert watch.delivered == [msgspec.structs.replace(SENT, room=room)]
    assert len(items) == 2  # the room first, the engine's counts last: nothing else changed


async def test_a_prefill_asked_for_none_sends_none():
    watch, engine = DeliveringWatch(), FakeEngine([final(LENGTH, with_prompt=False)])
    await collect(PrefillHandler(engine, CONFIG, rooms=watch).generate(FLAT))
    assert watch.delivered == [] and "logprob_start_len" not in engine.calls[0]


async def test_an_aborted_prefill_tells_the_decode_why_none_come():
    watch = DeliveringWatch()
    engine = FakeEngine([final({"type": "abort", "message": "gone"}, with_prompt=False)])
    with pytest.raises(EngineError, match="prefill engine aborted the request"):
        await collect(PrefillHandler(engine, CONFIG, rooms=watch).generate({**FLAT, **ASK}))
    [sent] = watch.delivered
    assert sent.room == ROOM and sent.tokens == [] and "aborted" in sent.error


async def test_a_prefill_without_a_room_watch_refuses_them_before_its_engine():
    engine = FakeEngine([final(LENGTH)])
    with pytest.raises(RequestError, match="no room watch"):
        await collect(PrefillHandler(engine, CONFIG).generate({**FLAT, **ASK}))
    assert engine.calls == []


async def _with_boot(request):
    yield dict(BOOT)
    await asyncio.Event().wait()  # the prefill's stream stays open until its engine is done


@pytest.mark.parametrize("orchestration", [Orchestration.FRONTEND, Orchestration.DECODE])
async def test_the_decode_yields_the_prefills_prompt_logprobs_as_aggregated_does(orchestration):
    agg = await collect(aggregated(FakeEngine([final(LENGTH)])).generate(
        {**DECODE_REQ, **ASK}))
    engine, claims = FakeEngine([final(LENGTH, with_prompt=False)]), Claims(SENT)
    prefill = FakePrefillClient(_with_boot) if orchestration is Orchestration.DECODE else None
    got = await collect(decode(engine, claims, orchestration, prefill).generate(
        {**DECODE_REQ, **ASK, "bootstrap_info": BOOT}, FakeContext()))
    assert got == agg and got[-1]["engine_data"]["prompt_logprobs"][0] is None
    assert claims.claimed == [ROOM]
    call = engine.calls[0]
    assert "logprob_start_len" not in call and call["top_logprobs_num"] == 2


@pytest.mark.parametrize("claims, words", [
    (None, "could not reach"),
    (Claims(PromptLogprobs(ROOM, error="the prefill engine aborted the request")), "aborted"),
])
async def test_prompt_logprobs_that_cannot_come_are_an_error_naming_why(claims, words):
    engine = FakeEngine([final(LENGTH, with_prompt=False)])
    with pytest.raises(PrefillError, match=words):
        await collect(decode(engine, claims).generate(
            {**DECODE_REQ, **ASK, "bootstrap_info": BOOT}, FakeContext()))
    assert (engine.calls == []) == (claims is None)  # no claim: refused before the engine


async def test_a_prefill_that_never_sends_them_fails_the_decode_in_bounded_time(monkeypatch):
    monkeypatch.setattr(prompt_logprobs, "WAIT_S", 0.05)
    engine = FakeEngine([final(LENGTH, with_prompt=False)])
    with pytest.raises(PrefillError, match="no prompt logprobs within 0.05 s"):
        await collect(decode(engine, Claims(None)).generate(
            {**DECODE_REQ, **ASK, "bootstrap_info": BOOT}, FakeContext()))


async def test_a_decode_asked_for_none_waits_for_none():
    engine = FakeEngine([final(LENGTH, with_prompt=False)])
    [out] = await collect(decode(engine, Claims(None)).generate(
        {**DECODE_REQ, "bootstrap_info": BOOT}, FakeContext()))
    assert "engine_data" not in out
