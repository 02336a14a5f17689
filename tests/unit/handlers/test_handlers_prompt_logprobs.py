"""Prompt logprobs and the matched stop in the handlers: `output_options.prompt_logprobs`
(completions' `echo`) -> SGLang's `logprob_start_len=0`; the engine's `input_token_logprobs` ->
Dynamo's `engine_data.prompt_logprobs` on the last delta; SGLang's `matched` -> Dynamo's
`stop_reason` (Tokens) or `nvext.stop_reason` when asked (Text). Disaggregated:
test_handlers_disagg_prompt_logprobs.py."""

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.core.errors import RequestError
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(30)

TOKENS = {"token_ids": [7, 8, 9], "stop_conditions": {"max_tokens": 2}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}


class _Pre:
    async def chat_token_ids(self, messages, kwargs=None, tools=None):
        return [1, 2]


def handler(engine, tokens=True):
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=1000,
                          skip_tokenizer_init=tokens, orchestration=Orchestration.NONE)
    return DecodeHandler(engine, config, preprocessor=None if tokens else _Pre())


def final(finish, with_prompt=True, output=True):
    c = chunk([5], finish, completion=1, text="x")
    meta = c["meta_info"]
    if output:
        meta["output_token_logprobs"] = [(-0.25, 5, None)]
        meta["output_top_logprobs"] = [[(-0.25, 5, None), (-2.0, 6, None), (-3.0, 7, None)]]
    if with_prompt:
        meta["input_token_logprobs"] = [(None, 7, None), (-1.5, 8, None), (-0.5, 9, None)]
        meta["input_top_logprobs"] = [None, [(-0.7, 4, None), (-1.5, 8, None)],
                                      [(-0.5, 9, None), (-0.9, 3, None)]]
    return c


async def test_echo_asks_the_engine_for_prompt_logprobs_and_yields_dynamos_payload():
    engine = FakeEngine([final({"type": "length", "length": 1})])
    req = {**TOKENS, "output_options": {"logprobs": 2, "prompt_logprobs": 1}}
    [out] = await collect(handler(engine).generate(req))
    call = engine.calls[0]
    assert (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"]) == \
        (True, 2, 0)
    assert out["engine_data"] == {"prompt_logprobs": [
        None, {"8": {"logprob": -1.5}, "4": {"logprob": -0.7, "rank": 1}},
        {"9": {"logprob": -0.5, "rank": 1}}]}
    assert out["log_probs"] == [-0.25] and len(out["top_logprobs"][0]) == 2  # logprobs=2
    assert "stop_reason" not in out  # a length finish matched nothing


async def test_echo_without_logprobs_sends_no_token_logprobs():
    engine = FakeEngine([final({"type": "stop", "matched": 2})])
    req = {**TOKENS, "output_options": {"prompt_logprobs": 1}}
    [out] = await collect(handler(engine).generate(req))
    assert engine.calls[0]["top_logprobs_num"] == 1
    assert "log_probs" not in out and "top_logprobs" not in out
    assert out["engine_data"]["prompt_logprobs"][0] is None
    assert out["stop_reason"] == 2  # EOS (or a stop id) as SGLang's matched_stop


@pytest.mark.parametrize("finish, want", [
    ({"type": "stop", "matched": "\n"}, "\n"),
    ({"type": "stop", "matched": 151645}, 151645),
    ({"type": "length", "length": 1}, None),
])
async def test_tokens_mode_reports_the_matched_stop(finish, want):
    engine = FakeEngine([final(finish, with_prompt=False, output=False)])
    [out] = await collect(handler(engine).generate(TOKENS))
    assert out.get("stop_reason") == want and "engine_data" not in out
    assert "logprob_start_len" not in engine.calls[0]


@pytest.mark.parametrize("extra, want", [(["stop_reason"], {"stop_reason": "\n"}), (None, None)])
async def test_text_mode_reports_the_matched_stop_when_asked(extra, want):
    engine = FakeEngine([chunk([5], text="a"),
                         chunk([6], {"type": "stop", "matched": "\n"}, completion=2, text="b")])
    body = {**CHAT, **({"nvext": {"extra_fields": extra}} if extra else {})}
    out = await collect(handler(engine, tokens=False).generate(body))
    assert "nvext" not in out[0]
    assert out[1]["choices"][0]["finish_reason"] == "stop" and out[1].get("nvext") == want


@pytest.mark.parametrize("value, words", [(21, "must be in [0, 20]"), (-1, "must be in")])
async def test_bad_prompt_logprobs_are_a_400(value, words):
    engine = FakeEngine([])
    with pytest.raises(RequestError, match="output_options.prompt_logprobs") as info:
        await collect(handler(engine).generate(
            {**TOKENS, "output_options": {"prompt_logprobs": value}}))
    assert words in str(info.value) and not engine.calls
