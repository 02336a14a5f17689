"""Every field the worker does not implement is a 400 naming it, in both modes, and only
when it is present with a non-default value (the engine is never called)."""

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.disagg.orchestration import Orchestration
from handlers.core.errors import RequestError
from tests.support.handler_fakes import FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(30)

TOKENS = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 2}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
DONE = [chunk([5], {"type": "length", "length": 1}, completion=1, text="x")]


class _Pre:
    """Stands in for the Preprocessor: these requests never need a real template."""

    async def chat_token_ids(self, messages, kwargs=None, tools=None):
        return [1, 2]


def handler(tokens: bool, engine: FakeEngine) -> DecodeHandler:
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                          orchestration=Orchestration.NONE, skip_tokenizer_init=tokens)
    return DecodeHandler(engine, config, preprocessor=None if tokens else _Pre())


@pytest.mark.parametrize("patch, field", [
    ({"sampling_options": {"best_of": 2}}, "sampling_options.best_of"),
    ({"sampling_options": {"use_beam_search": True}}, "sampling_options.use_beam_search"),
    ({"sampling_options": {"length_penalty": 0.5}}, "sampling_options.length_penalty"),
    ({"multi_modal_data": {"image_url": [{"Url": "http://x/y.png"}]}}, "multi_modal_data"),
])
async def test_tokens_mode_refuses_unimplemented_fields(patch, field):
    engine = FakeEngine(DONE)
    with pytest.raises(RequestError, match="not supported") as info:
        await collect(handler(True, engine).generate({**TOKENS, **patch}))
    assert str(info.value).startswith(field)
    assert engine.calls == []


@pytest.mark.parametrize("patch, field", [
    ({"functions": [TOOLS[0]["function"]]}, "functions"),  # legacy; `tools` is served
    ({"function_call": "auto"}, "function_call"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"best_of": 3}, "best_of"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"structured_outputs": {"json": {"type": "object"}}}, "structured_outputs"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"audio": {"voice": "x"}}, "audio"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
])
async def test_text_mode_refuses_unimplemented_fields(patch, field):
    engine = FakeEngine(DONE)
    with pytest.raises(RequestError, match="not supported") as info:
        await collect(handler(False, engine).generate({**CHAT, **patch}))
    assert str(info.value).startswith(f"{field}: ")
    assert engine.calls == []


@pytest.mark.parametrize("patch", [
    {"logprobs": False}, {"top_logprobs": 0}, {"tools": []}, {"tool_choice": "none"},
    {"response_format": {"type": "text"}}, {"logit_bias": {}}, {"best_of": 1},
    {"modalities": ["text"]}, {"user": "bob"}, {"store": False},
])
async def test_text_mode_default_values_pass(patch):
    engine = FakeEngine(DONE)
    out = await collect(handler(False, engine).generate({**CHAT, **patch}))
    assert len(engine.calls) == 1 and out


async def test_tokens_mode_default_values_pass():
    engine = FakeEngine(DONE)
    patch = {"output_options": {"logprobs": None, "prompt_logprobs": None},
             "sampling_options": {"best_of": 1, "use_beam_search": False, "guided_decoding": None},
             "multi_modal_data": None}
    await collect(handler(True, engine).generate({**TOKENS, **patch}))
    assert len(engine.calls) == 1
