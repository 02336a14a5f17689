"""chat_template_kwargs carries template variables only: apply_chat_template's own parameters
are a 400 naming the key, in either field the variables arrive in; the variables have a size
budget, rendering a time budget, and a request with variables never renders on the loop."""

import copy
import inspect
import time

import pytest
from transformers import PreTrainedTokenizerBase

from handlers import DecodeConfig, DecodeHandler, Orchestration, PreprocessConfig, Preprocessor
from handlers.core.errors import RequestError
from handlers.text.render_budget import RenderTimeout, within_budget
from handlers.text.template_kwargs import MAX_KWARGS_BYTES, RESERVED_KEYS
from tests.support.handler_fakes import FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "user", "content": "hi"}]
DONE = [chunk([5], {"type": "length", "length": 1}, completion=1, text="x")]
# Nested loops over a variable the client sets: cheap for small values, minutes for big ones
# (the sandbox caps one range() at 100k items, not the nesting).
SLOW_TEMPLATE = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                 "{% for i in range(reps|int) %}{% for j in range(reps|int) %}"
                 "{% endfor %}{% endfor %}")


def text_handler(engine, pre) -> DecodeHandler:
    config = DecodeConfig(served_model_name="tiny", context_length=512, vocab_size=2048,
                          orchestration=Orchestration.NONE, skip_tokenizer_init=False)
    return DecodeHandler(engine, config, preprocessor=pre)


def test_reserved_keys_are_the_parameters_of_the_installed_apply_chat_template():
    params = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    assert params - {"self"} <= RESERVED_KEYS


@pytest.mark.parametrize("field", ["chat_template_kwargs", "chat_template_args"])
@pytest.mark.parametrize("key, value", [
    ("chat_template", "{{ 'pwned' }}"), ("tokenize", True), ("add_generation_prompt", False),
    ("return_tensors", "pt"), ("continue_final_message", True), ("tools", []),
    ("documents", [{"text": "x"}]), ("return_dict", True), ("padding", True),
    ("truncation", True), ("max_length", 3),
])
async def test_call_parameters_are_refused_naming_the_key(pre, field, key, value):
    engine = FakeEngine(DONE)
    request = {"messages": MESSAGES, "max_tokens": 1, field: {key: value}}
    with pytest.raises(RequestError) as info:
        await collect(text_handler(engine, pre).generate(request))
    assert str(info.value).startswith(f"{field}.{key}: not a template variable")
    assert engine.calls == []


@pytest.mark.parametrize("kwargs, words", [
    ({"x": "y" * (MAX_KWARGS_BYTES + 1)}, ["bytes", str(MAX_KWARGS_BYTES)]),
    ({f"k{i}": 1 for i in range(100)}, ["at most"]),
    ({"not a name": 1}, ["not a valid template variable"]),
])
async def test_variables_over_budget_are_refused(pre, kwargs, words):
    request = {"messages": MESSAGES, "max_tokens": 1, "chat_template_kwargs": kwargs}
    with pytest.raises(RequestError) as info:
        await collect(text_handler(FakeEngine(DONE), pre).generate(request))
    assert all(w in str(info.value) for w in words), str(info.value)


async def test_template_variables_pass_and_render_off_the_loop(pre, tok):
    assert pre.inline_runs == 0
    engine = FakeEngine(DONE)
    request = {"messages": MESSAGES, "max_tokens": 1,
               "chat_template_args": {"enable_thinking": True}}
    await collect(text_handler(engine, pre).generate(request))
    assert engine.calls[0]["input_ids"] == tok.apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert pre.inline_runs == 0  # with variables: the worker thread, never the loop
    await pre.chat_token_ids(MESSAGES)
    assert pre.inline_runs == 1  # the same short message without variables may run inline


async def test_a_template_past_its_time_budget_is_a_request_error(tok):
    slow = copy.copy(tok)
    slow.chat_template = SLOW_TEMPLATE
    pre = Preprocessor(slow, PreprocessConfig(render_budget_s=0.3))
    try:
        assert await pre.chat_token_ids(MESSAGES, {"reps": 2})  # small: renders
        t0 = time.monotonic()
        with pytest.raises(RequestError, match="time budget"):
            await pre.chat_token_ids(MESSAGES, {"reps": 100000})
        assert time.monotonic() - t0 < 3.0
        # The worker thread is free again for the next request.
        assert await pre.chat_token_ids(MESSAGES, {"reps": 1})
    finally:
        pre.shutdown()


def test_within_budget_restores_the_previous_tracer():
    import sys

    import jinja2

    def tracer(frame, event, arg):
        return None

    template = jinja2.Environment().from_string(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(RenderTimeout):
            within_budget(template.render, 0.1)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)
