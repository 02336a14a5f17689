"""Text mode's tool calls and reasoning in the handlers, with a fake parser (SGLang's own are
tested through components/backends/sglang_parsers.py): what the template renders, the forced
tool choice's constraint, the deltas and finish reasons a client receives."""

from typing import Any, Optional

import pytest

from handlers.text.chat_outputs import ChoiceOutputs
from handlers.text.chat_stream import ChatStream
from handlers.core.errors import RequestError
from handlers.text.tool_calls import Parsed, ToolCallDelta, add_constraint, plan_output
from protocol.chat import ChatCompletionRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


class FakeParse:
    """Reasoning up to "|", then each "@name" is a whole call."""

    def __init__(self) -> None:
        self.fed: list[str] = []

    def feed(self, text: str) -> Parsed:
        self.fed.append(text)
        return Parsed(content=text)

    def finish(self) -> Parsed:
        return Parsed(calls=[ToolCallDelta(0, "get_weather", '{"a": 1}')])

    def parse_all(self, text: str) -> Parsed:
        reasoning, _, rest = text.partition("|")
        return Parsed(reasoning=reasoning, content=rest,
                      calls=[ToolCallDelta(0, "get_weather", "{}")] if "@" in rest else [])


class FakeParsers:
    def __init__(self, tools: bool = True, reasoning: bool = True) -> None:
        self.parses_tool_calls, self.parses_reasoning = tools, reasoning
        self.started: list[Any] = []

    def tool_constraint(self, tools, tool_choice, parallel_tool_calls):
        return "structural_tag", f"{[t['function']['name'] for t in tools]}:{parallel_tool_calls}"

    def start(self, tools, tool_choice, template_kwargs) -> Optional[FakeParse]:
        self.started.append((tools, tool_choice, template_kwargs))
        return FakeParse()


def req(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **body)


def test_tools_are_rendered_and_parsed_under_auto():
    plan = plan_output(req(tools=[WEATHER, TIME]), FakeParsers(), {"enable_thinking": True})
    assert [t["function"]["name"] for t in plan.template_tools] == ["get_weather", "get_time"]
    assert plan.constraint is None and plan.new_parse() is not None


def test_tool_choice_none_renders_and_parses_no_tools():
    parsers = FakeParsers(reasoning=False)
    plan = plan_output(req(tools=[WEATHER], tool_choice="none"), parsers, {})
    assert plan.template_tools is None and plan.new_parse is None


def test_a_named_tool_is_the_only_one_rendered_and_constrained():
    named = {"type": "function", "function": {"name": "get_time"}}
    plan = plan_output(req(tools=[WEATHER, TIME], tool_choice=named,
                           parallel_tool_calls=False), FakeParsers(), {})
    assert [t["function"]["name"] for t in plan.template_tools] == ["get_time"]
    assert plan.constraint == ("structural_tag", "['get_time']:False")


@pytest.mark.parametrize("body, parsers, message", [
    ({"tool_choice": "required"}, FakeParsers(), "needs `tools`"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     FakeParsers(), "'x' is not among"),
    ({"tools": [WEATHER], "tool_choice": "required"}, None, "--tool-call-parser"),
])
def test_a_tool_choice_that_cannot_be_served_is_a_400(body, parsers, message):
    with pytest.raises(RequestError, match=message):
        plan_output(req(**body), parsers, {})


def test_without_parsers_tools_are_still_rendered():
    plan = plan_output(req(tools=[WEATHER]), None, {})
    assert plan.template_tools == [WEATHER] and plan.new_parse is None


def test_a_forced_tool_choice_cannot_share_the_output_with_another_constraint():
    params = {"regex": "a+"}
    with pytest.raises(RequestError, match="cannot be combined .*\\(regex\\)"):
        add_constraint(params, ("structural_tag", "{}"))
    params = {}
    add_constraint(params, ("structural_tag", "{}"))
    assert params == {"structural_tag": "{}"}


def test_unknown_tool_shapes_are_a_400_at_parse_time():
    with pytest.raises(ValueError):
        req(tools=[{"type": "function", "function": {"name": ""}}])


def _chunk(text: str, finish: Optional[str] = None) -> dict:
    meta = {"finish_reason": {"type": finish} if finish else None, "prompt_tokens": 3,
            "completion_tokens": 2}
    return {"text": text, "meta_info": meta}


def test_streamed_call_gets_an_id_once_and_finishes_with_tool_calls():
    stream = ChatStream("id", "m", False, outputs=ChoiceOutputs(FakeParse, stream=True))
    first = stream.convert(_chunk("hello"))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "hello"}
    last = stream.convert(_chunk("", "stop"))
    [call] = last["choices"][0]["delta"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"a": 1}'}
    assert last["choices"][0]["finish_reason"] == "tool_calls"


def test_not_streaming_the_text_is_parsed_whole_at_the_end():
    stream = ChatStream("id", "m", True, outputs=ChoiceOutputs(FakeParse, stream=False))
    assert stream.convert(_chunk("thinking|an")) is None  # held until the end
    last = stream.convert(_chunk("swer @", "length"))
    delta = last["choices"][0]["delta"]
    assert (delta["reasoning_content"], delta["content"]) == ("thinking", "answer @")
    assert delta["tool_calls"][0]["function"]["name"] == "get_weather"
    assert last["choices"][0]["finish_reason"] == "length"  # a cut-off call is not "tool_calls"

