"""Tool-call and reasoning requests for the end-to-end tests, on the `qwen3`-template model.

A random model never writes a tool call or a thinking block by itself, so the requests make it
write one honestly: `guided_regex` constrains the generation to the exact text of a Qwen3 tool
call (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`) or thinking block, and the
tests check what the parsers made of it on the client's side. `required` and named tool
choices need no regex: the parser's own constraint makes the model call a tool; the tools are
`strict` with closed schemas, so the random model's arguments end.
"""

from __future__ import annotations

import json
from typing import Any

# Dynamo's name for the Qwen3/Hermes `<tool_call>` format (the frontend parses, Tokens mode),
# and SGLang's (the worker parses, Text mode); both reasoning parsers are `qwen3`.
DYN_PARSER_ARGS = ("--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3")
NATIVE_PARSER_ARGS = ("--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3")


def _tool(name: str, prop: str, values: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": {prop: {"type": "string", "enum": values}},
              "required": [prop], "additionalProperties": False}
    return {"type": "function",
            "function": {"name": name, "description": f"{name} by {prop}", "strict": True,
                         "parameters": params}}


WEATHER = _tool("get_weather", "city", ["Paris", "Rome"])
TIME = _tool("get_time", "zone", ["UTC", "CET"])
TOOLS = [WEATHER, TIME]
ENUMS = {"get_weather": ("city", {"Paris", "Rome"}), "get_time": ("zone", {"UTC", "CET"})}


def _escape(text: str) -> str:
    """A regex matching exactly `text` (xgrammar's syntax: no `\\ ` for a space)."""
    return "".join("\\" + c if c in ".^$|?*+()[]{}\\" else "\\n" if c == "\n" else c
                   for c in text)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def forced(text: str) -> dict[str, Any]:
    """The request fields that make the model write exactly `text`."""
    return {"guided_regex": _escape(text)}


THINK = "The user wants the weather."
ANSWER = "It is sunny."
THINKING_TEXT = f"<think>\n{THINK}\n</think>\n\n{ANSWER}"


def args_of(call: Any) -> dict[str, Any]:
    return json.loads(call.function.arguments)


def assert_enum_call(call: Any, name: str) -> None:
    """A call to `name` whose arguments satisfy its closed schema."""
    assert call.type == "function" and call.id
    assert call.function.name == name
    prop, values = ENUMS[name]
    args = args_of(call)
    assert set(args) == {prop} and args[prop] in values, args


def collect_stream(chunks: Any) -> dict[str, Any]:
    """An OpenAI SDK stream -> content, reasoning, tool calls (assembled by index, as a client
    does), finish reason; the first delta of each call must carry its id and name."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            out["content"] += delta.content or ""
            out["reasoning"] += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                if call.index not in out["calls"]:
                    assert call.id and call.function.name, call
                    out["calls"][call.index] = {"id": call.id, "name": call.function.name,
                                                "arguments": ""}
                out["calls"][call.index]["arguments"] += call.function.arguments or ""
            out["finish"] = choice.finish_reason or out["finish"]
    return out


def reasoning_and_content(got: Any, stream: bool) -> tuple[str | None, str | None]:
    """The reasoning and the content a client received, streamed or whole."""
    if stream:
        collected = collect_stream(got)
        return collected["reasoning"], collected["content"]
    message = got.choices[0].message
    return getattr(message, "reasoning_content", None), message.content
