"""Handlers' logprobs: request -> engine kwargs, engine meta_info -> Dynamo's token-delta fields
(Tokens mode) and OpenAI's chat `logprobs.content` (Text mode), the 400s, and the prefill's ask."""

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.core.errors import RequestError
from handlers.core.logprobs import ChatLogprobs
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import BOOT, FakeContext, FakeEngine, FakePrefillClient, chunk, collect

pytestmark = pytest.mark.timeout(30)

TOKENS = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 2}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
LOGPROB_KW = {"return_logprob": True, "top_logprobs_num": 2}


def lp_chunk(ids, finish=None, text=None, top=True, completion=0):
    c = chunk(ids, finish, text=text, completion=completion)
    c["meta_info"]["output_token_logprobs"] = [(-0.5 - t / 100, t, None) for t in ids]
    if top:
        c["meta_info"]["output_top_logprobs"] = [[(-0.5, t, None), (-1.5, t + 1, None)]
                                                 for t in ids]
    return c


STREAM = [lp_chunk([65]), lp_chunk([66, 67], {"type": "length", "length": 3}, completion=3)]


def handler(engine, tokens=True, pre=None, prefill=None):
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=1000,
                          skip_tokenizer_init=tokens,
                          orchestration=(Orchestration.DECODE if prefill is not None
                                         else Orchestration.NONE))
    return DecodeHandler(engine, config, prefill_client=prefill, preprocessor=pre)


async def test_tokens_mode_yields_dynamos_logprob_fields():
    engine = FakeEngine(STREAM)
    req = {**TOKENS, "output_options": {"logprobs": 2}}
    out = await collect(handler(engine).generate(req))
    assert {k: engine.calls[0][k] for k in LOGPROB_KW} == LOGPROB_KW
    assert out[0]["log_probs"] == [-1.15]
    assert out[0]["top_logprobs"] == [[
        {"rank": 1, "token_id": 65, "token": None, "logprob": -0.5},
        {"rank": 2, "token_id": 66, "token": None, "logprob": -1.5}]]
    assert out[1]["token_ids"] == [66, 67] and len(out[1]["log_probs"]) == 2
    assert len(out[1]["top_logprobs"]) == 2 and out[1]["finish_reason"] == "length"


async def test_tokens_mode_without_logprobs_asks_for_none():
    engine = FakeEngine([chunk([5], {"type": "length", "length": 1}, completion=1)])
    out = await collect(handler(engine).generate(TOKENS))
    assert "return_logprob" not in engine.calls[0] and "log_probs" not in out[0]


@pytest.mark.parametrize("tokens, patch, field", [
    (True, {"output_options": {"logprobs": 21}}, "output_options.logprobs"),
    (False, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (False, {"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    (False, {"top_logprobs": 2}, "top_logprobs: logprobs must be true"),
    (False, {"logprobs": "yes"}, "logprobs must be a boolean"),
])
async def test_bad_logprob_requests_are_400s(tokens, patch, field, pre):
    engine = FakeEngine(STREAM)
    with pytest.raises(RequestError, match=field):
        await collect(handler(engine, tokens, pre).generate({**(TOKENS if tokens else CHAT),
                                                             **patch}))
    assert engine.calls == []


async def test_text_mode_chat_logprobs_ride_with_their_text(pre, tok):
    # The first token's text is held back by the engine (part of a character): its logprobs
    # wait and go out with the next chunk that has text.
    engine = FakeEngine([lp_chunk([65], text=""), lp_chunk([66], text="AB"),
                         lp_chunk([67], {"type": "length", "length": 3}, text="C")])
    out = await collect(handler(engine, False, pre).generate(
        {**CHAT, "logprobs": True, "top_logprobs": 2}, FakeContext()))
    assert {k: engine.calls[0][k] for k in LOGPROB_KW} == LOGPROB_KW
    first = out[0]["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in first] == pytest.approx([-1.15, -1.16])
    text65 = tok.decode([65])
    assert first[0] == {"token": text65, "logprob": -1.15, "bytes": list(text65.encode()),
                        "top_logprobs": [
                            {"token": text65, "logprob": -0.5, "bytes": list(text65.encode())},
                            {"token": tok.decode([66]), "logprob": -1.5,
                             "bytes": list(tok.decode([66]).encode())}]}
    assert len(out[1]["choices"][0]["logprobs"]["content"]) == 1


async def test_text_mode_without_logprobs_sends_no_logprobs_key(pre):
    engine = FakeEngine([chunk([5], {"type": "length", "length": 1}, completion=1, text="x")])
    out = await collect(handler(engine, False, pre).generate(CHAT, FakeContext()))
    assert "logprobs" not in out[0]["choices"][0] and "return_logprob" not in engine.calls[0]


def test_partial_character_token_has_its_own_bytes(tok):
    # A byte-level BPE token holding one byte of a multi-byte character decodes to U+FFFD;
    # its bytes must be the real byte, as OpenAI's `bytes` field promises.
    byte_token = tok.convert_tokens_to_ids("\u00e2")  # GPT-2 alphabet: byte 0xE2
    content = ChatLogprobs(lambda: tok).convert(
        {"output_token_logprobs": [(-1.0, byte_token, None)]}).content
    assert content[0].token == "\ufffd" and content[0].bytes == [0xE2]


async def test_disagg_prefill_is_asked_for_the_first_tokens_logprobs(pre):
    async def items(request):
        yield dict(BOOT)
        yield {"finished": True}

    prefill = FakePrefillClient(items)
    engine = FakeEngine(STREAM)
    await collect(handler(engine, False, pre, prefill).generate(
        {**CHAT, "logprobs": True, "top_logprobs": 2}, FakeContext()))
    assert prefill.requests[0]["request"]["output_options"]["logprobs"] == 2
    assert engine.calls[0]["return_logprob"] is True
