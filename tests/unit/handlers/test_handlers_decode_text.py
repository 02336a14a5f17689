"""DecodeHandler in Text mode (no skip_tokenizer_init): the real tiny tokenizer through the
Preprocessor, a fake engine; chat chunks out, ids (never messages) to the prefill worker."""

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.core.errors import RequestError
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import BOOT, FakeContext, FakeEngine, FakePrefillClient, chunk, collect

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
ENGINE_CHUNKS = [
    chunk([10], text="Hi", completion=1, prompt=9),
    chunk([11], text=" there", completion=2, prompt=9),
    chunk([12], {"type": "stop", "matched": 2}, text="", completion=3, prompt=9, cached=4),
]


def config(**kw):
    base = dict(served_model_name="tiny", context_length=512, vocab_size=2048,
                skip_tokenizer_init=False, orchestration=Orchestration.NONE)
    return DecodeConfig(**{**base, **kw})


def expected_ids(tok):
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tok(prompt, add_special_tokens=False)["input_ids"]


async def test_text_mode_streams_chat_chunks_with_usage(pre, tok):
    engine = FakeEngine(ENGINE_CHUNKS)
    request = {"messages": MESSAGES, "model": "tiny", "max_tokens": 5, "stream": True,
               "stream_options": {"include_usage": True}, "temperature": 0.0}
    out = await collect(DecodeHandler(engine, config(), preprocessor=pre).generate(
        request, FakeContext("abc")))
    call = engine.calls[0]
    assert call["input_ids"] == expected_ids(tok)  # tokenized once, by the worker
    assert call["sampling_params"] == {"max_new_tokens": 5, "temperature": 0.0}
    assert [c["choices"][0]["delta"] for c in out[:-1]] == [
        {"role": "assistant", "content": "Hi"}, {"content": " there"}, {}]
    assert out[-2]["choices"][0]["finish_reason"] == "stop"
    assert out[-1]["choices"] == []
    assert out[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                                "prompt_tokens_details": {"cached_tokens": 4}}
    assert all(c["id"] == "chatcmpl-abc" and c["model"] == "tiny" for c in out)


async def test_streaming_without_include_usage_has_no_usage_chunk(pre):
    engine = FakeEngine(ENGINE_CHUNKS)
    out = await collect(DecodeHandler(engine, config(), preprocessor=pre).generate(
        {"messages": MESSAGES, "stream": True}, FakeContext()))
    assert all(c["choices"] for c in out)


async def test_text_disagg_sends_token_ids_not_messages(pre, tok):
    async def items(request):
        yield dict(BOOT)
        yield {"finished": True}

    prefill = FakePrefillClient(items)
    engine = FakeEngine(ENGINE_CHUNKS)
    handler = DecodeHandler(engine, config(orchestration=Orchestration.DECODE), prefill, pre)
    await collect(handler.generate({"messages": MESSAGES, "max_tokens": 3}, FakeContext()))
    sent = prefill.requests[0]
    assert sent["request"]["token_ids"] == expected_ids(tok)
    assert "messages" not in sent["request"]
    assert sent["sampling_params"]["max_new_tokens"] == 3
    assert engine.calls[0]["bootstrap_room"] == BOOT["bootstrap_room"]


@pytest.mark.parametrize("request_body, message", [
    ({"messages": []}, "messages: must not be empty"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role: must be one of"),
    ({"messages": MESSAGES, "max_tokens": -1}, "max_tokens: must be >= 1"),
    ({"messages": MESSAGES, "temperature": -0.5}, "temperature: must be >= 0"),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, "prompt is too long"),
    ({"messages": MESSAGES, "nvext": {"token_data": [1, 2048]}},
     "nvext.token_data[1]: token id 2048 is out of vocabulary (vocab size 2048)"),
    ({"messages": MESSAGES, "nvext": {"token_data": [1, -3]}}, "nvext.token_data[1]: must be >= 0"),
])
async def test_text_mode_bad_requests(pre, request_body, message):
    engine = FakeEngine(ENGINE_CHUNKS)
    with pytest.raises(RequestError) as info:
        await collect(DecodeHandler(engine, config(context_length=256), preprocessor=pre)
                      .generate(request_body, FakeContext()))
    assert str(info.value).startswith(message)
    assert engine.calls == []


async def test_text_disagg_n2_asks_prefill_for_both_choices(pre):
    async def items(request):
        yield dict(BOOT)
        yield {"finished": True}

    engine, prefill = FakeEngine(ENGINE_CHUNKS), FakePrefillClient(items)
    await collect(DecodeHandler(engine, config(orchestration=Orchestration.DECODE), prefill, pre)
                  .generate({"messages": MESSAGES, "n": 2}, FakeContext()))
    assert prefill.requests[0]["sampling_params"]["n"] == 2
    assert engine.calls[0]["sampling_params"]["n"] == 2


async def test_nvext_token_data_replaces_the_chat_template(pre):
    engine = FakeEngine(ENGINE_CHUNKS)
    request = {"messages": MESSAGES, "nvext": {"token_data": [5, 6, 7]}, "max_tokens": 2}
    await collect(DecodeHandler(engine, config(), preprocessor=pre).generate(
        request, FakeContext()))
    assert engine.calls[0]["input_ids"] == [5, 6, 7]
