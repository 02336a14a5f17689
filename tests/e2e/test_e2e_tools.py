"""Tool calls and reasoning through the real frontend with the OpenAI SDK, on the CPU engine,
in both modes, aggregated (`tiny-agg`) and disaggregated (`tiny`).

Tokens mode: the workers register Dynamo's parsers (`--dyn-tool-call-parser hermes
--dyn-reasoning-parser qwen3`) and the frontend parses what it detokenizes. Text mode: the
workers render `tools` into the chat template and parse with SGLang's own parsers
(`--tool-call-parser qwen25 --reasoning-parser qwen3`). The model is the `tiny` weights with
Qwen3's template; what it writes is forced with structured output (tests/support/tool_calls.py).
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.models import model_path
from tests.support.structured_schemas import WHITESPACE_ARGS
from tests.support.tool_calls import (
    ANSWER, DYN_PARSER_ARGS, NATIVE_PARSER_ARGS, THINK, THINKING_TEXT, TIME, TOOLS, WEATHER,
    args_of, assert_enum_call, call_text, collect_stream, forced, reasoning_and_content,
)
from tests.support.topologies import AGG, DISAGG, FRONTEND_ORCHESTRATED, start_topology

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODES = ["tokens", "text"]
MODELS = [DISAGG, AGG]
PARIS = call_text("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    path = str(model_path("tiny", chat_template="qwen3"))
    started = {}
    try:
        started["tokens"] = start_topology(
            tmp_path_factory.mktemp("tools-tokens"), path, True,
            worker_args=(*WHITESPACE_ARGS, *DYN_PARSER_ARGS), orchestrator=FRONTEND_ORCHESTRATED)
        started["text"] = start_topology(tmp_path_factory.mktemp("tools-text"), path, False,
                                         worker_args=(*WHITESPACE_ARGS, *NATIVE_PARSER_ARGS))
        yield started
    finally:
        for stack in started.values():
            stack.stop()


def client(stacks, mode: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stacks[mode].url}/v1", api_key="none", timeout=120,
                         max_retries=0)


def ask(stacks, mode: str, model: str, stream: bool = False, **body):
    body = {"model": model, "max_tokens": 120, "temperature": 0.0,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}], **body}
    extra = {key: body.pop(key) for key in ("guided_regex", "chat_template_kwargs",
                                            "separate_reasoning") if key in body}
    return client(stacks, mode).chat.completions.create(stream=stream, extra_body=extra, **body)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_auto_tool_call_is_parsed(stacks, mode, model):
    got = ask(stacks, mode, model, tools=TOOLS, tool_choice="auto", **forced(PARIS))
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and args_of(call) == {"city": "Paris"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_streamed_tool_call_arrives_as_deltas(stacks, mode, model):
    got = collect_stream(ask(stacks, mode, model, stream=True, tools=TOOLS, **forced(PARIS)))
    assert got["finish"] == "tool_calls", got
    assert not got["content"].strip()
    [call] = got["calls"].values()
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("mode", MODES)
def test_parallel_tool_calls(stacks, mode):
    text = PARIS + "\n" + call_text("get_time", {"zone": "UTC"})
    got = ask(stacks, mode, DISAGG, tools=TOOLS, parallel_tool_calls=True, **forced(text))
    calls = got.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert args_of(calls[1]) == {"zone": "UTC"}
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_required_tool_choice_calls_a_tool(stacks, mode, model):
    got = ask(stacks, mode, model, tools=TOOLS, tool_choice="required")
    calls = got.choices[0].message.tool_calls
    assert calls, got.choices[0]
    for call in calls:
        assert_enum_call(call, call.function.name)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_tool_choice_calls_that_tool(stacks, mode, stream):
    named = {"type": "function", "function": {"name": "get_time"}}
    got = ask(stacks, mode, DISAGG, stream=stream, tools=TOOLS, tool_choice=named)
    if stream:
        calls = collect_stream(got)["calls"].values()
        assert [c["name"] for c in calls] == ["get_time"], calls
        return
    [call] = got.choices[0].message.tool_calls
    assert_enum_call(call, "get_time")


@pytest.mark.parametrize("mode", MODES)
def test_tool_choice_none_leaves_a_call_as_content(stacks, mode):
    got = ask(stacks, mode, DISAGG, tools=TOOLS, tool_choice="none", **forced(PARIS)).choices[0]
    assert got.finish_reason == "stop" and not got.message.tool_calls
    assert got.message.content == PARIS


@pytest.mark.parametrize("mode", MODES)
def test_no_tool_parsing_without_tools(stacks, mode):
    """The same text without `tools` is content: a parser has nothing to call."""
    got = ask(stacks, mode, AGG, **forced(PARIS)).choices[0]
    assert got.finish_reason == "stop" and not got.message.tool_calls
    assert got.message.content == PARIS


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_is_split_from_content(stacks, mode, model, stream):
    got = ask(stacks, mode, model, stream=stream, **forced(THINKING_TEXT))
    reasoning, content = reasoning_and_content(got, stream)
    assert reasoning is not None and reasoning.strip() == THINK
    assert content.strip() == ANSWER


@pytest.mark.parametrize("mode", MODES)
def test_thinking_then_tool_call(stacks, mode):
    text = f"<think>\n{THINK}\n</think>\n\n{PARIS}"
    got = ask(stacks, mode, DISAGG, tools=[WEATHER, TIME], **forced(text)).choices[0]
    assert getattr(got.message, "reasoning_content", "").strip() == THINK
    [call] = got.message.tool_calls
    assert args_of(call) == {"city": "Paris"}


def test_text_mode_enable_thinking_false_is_all_content(stacks):
    """`enable_thinking: false` renders an empty thinking block, so what the model writes is
    the answer; by default SGLang's qwen3 parser reads an untagged answer as reasoning."""
    off = ask(stacks, "text", AGG, chat_template_kwargs={"enable_thinking": False},
              **forced(ANSWER)).choices[0].message
    assert off.content == ANSWER and not getattr(off, "reasoning_content", None)
    on = ask(stacks, "text", AGG, **forced(ANSWER)).choices[0].message
    assert getattr(on, "reasoning_content", None) == ANSWER and not on.content


@pytest.mark.parametrize("body, needle", [
    ({"tool_choice": "required"}, "tools is empty"),  # the frontend's own 400
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "not present in tools"),  # the frontend's
    ({"tools": [WEATHER], "tool_choice": "required", **forced(PARIS)}, "cannot be combined"),
])
def test_text_mode_bad_tool_choice_is_a_400(stacks, body, needle):
    with pytest.raises(openai.BadRequestError) as err:
        ask(stacks, "text", AGG, **body)
    assert needle in str(err.value)



@pytest.mark.parametrize("mode", MODES)
def test_explicit_thinking_block_is_split_with_thinking_off(stacks, mode):
    """`enable_thinking: false` changes the prompt, not the parsing of what the model wrote:
    both parsers (Dynamo's in the frontend, SGLang's in the worker) still split a block the
    model opened itself."""
    got = ask(stacks, mode, AGG, chat_template_kwargs={"enable_thinking": False},
              **forced(THINKING_TEXT)).choices[0].message
    assert got.content.strip() == ANSWER
    assert getattr(got, "reasoning_content", "").strip() == THINK


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_result_turn_is_rendered_and_answered(stacks, mode):
    """The call and its result go back into the template (assistant `tool_calls`, a `tool`
    message): the prompt grows by them, and the answer is plain content."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    first = ask(stacks, mode, AGG, tools=TOOLS, max_tokens=4)
    got = ask(stacks, mode, AGG, tools=TOOLS, messages=history, **forced(THINKING_TEXT))
    message = got.choices[0].message
    assert message.content.strip() == ANSWER and not message.tool_calls
    assert got.usage.prompt_tokens > first.usage.prompt_tokens + 20



@pytest.mark.parametrize("mode", MODES)
def test_separate_reasoning_is_the_frontends_400(stacks, mode):
    """SGLang's `separate_reasoning` switch never reaches a worker: 1.6.1's frontend refuses it."""
    with pytest.raises(openai.BadRequestError, match="separate_reasoning"):
        ask(stacks, mode, AGG, separate_reasoning=False, max_tokens=2)
