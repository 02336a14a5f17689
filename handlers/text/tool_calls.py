"""Text mode: tool calls and reasoning in the worker's own output
(docs/reference/tool-calls.md).

The worker renders `tools` into the chat template and, when started with SGLang's
`--tool-call-parser` / `--reasoning-parser`, splits what the model writes into OpenAI's
`tool_calls`, `reasoning_content` and `content`. The parsing is SGLang's own
(components/backends/sglang_parsers.py); handlers see it only through the Protocols here.
`tool_choice` follows SGLang's serving_chat: `none` renders no tools and parses none; a named
tool renders only that tool; `required` and a named tool constrain the output to tool calls
(SGLang's structural tag), which cannot be combined with another output constraint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from handlers.core.errors import RequestError
from protocol.chat import ChatCompletionRequest
from protocol.tools import tool_choice_name

# SGLang's sampling params that constrain the output (handlers/core/guided.py sets them).
CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass(frozen=True)
class ToolCallDelta:
    index: int  # which call of the choice (parallel calls count up from 0)
    name: Optional[str]  # set on a call's first delta
    arguments: str  # JSON text of the arguments, or the next piece of it


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


class OutputParse(Protocol):
    """One choice's output, parsed as it streams (`feed`, then `finish`) or whole."""

    def feed(self, text: str) -> Parsed: ...

    def finish(self) -> Parsed: ...

    def parse_all(self, text: str) -> Parsed: ...


class ChatParsers(Protocol):
    """The worker's configured parsers. Methods raise ValueError for tools or a choice the
    parser cannot serve (the message is the client's)."""

    parses_tool_calls: bool
    parses_reasoning: bool

    def tool_constraint(self, tools: list[dict[str, Any]], tool_choice: Any,
                        parallel_tool_calls: bool) -> Optional[tuple[str, str]]: ...

    def start(self, tools: Optional[list[dict[str, Any]]], tool_choice: Any,
              template_kwargs: dict[str, Any]) -> Optional[OutputParse]: ...


@dataclass(frozen=True)
class OutputPlan:
    """What a request's tools and parsers change: the tools the template renders, the
    constraint added to the sampling params, and a fresh parse per choice (None: plain text)."""

    template_tools: Optional[list[dict[str, Any]]] = None
    constraint: Optional[tuple[str, str]] = None
    new_parse: Optional[Callable[[], Optional[OutputParse]]] = None


def plan_output(req: ChatCompletionRequest, parsers: Optional[ChatParsers],
                template_kwargs: dict[str, Any]) -> OutputPlan:
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    named = tool_choice_name(req.tool_choice)
    _check_choice(tools, choice, named, parsers)
    if choice == "none":
        tools = []
    elif named is not None:
        tools = [t for t in tools if t["function"]["name"] == named]
    parse_tools = bool(tools) and parsers is not None and parsers.parses_tool_calls
    if parsers is None or not (parse_tools or parsers.parses_reasoning):
        return OutputPlan(template_tools=tools or None)
    wire_choice = req.tool_choice.model_dump() if named is not None else choice
    constraint = None
    try:
        if parse_tools and (choice == "required" or named is not None):
            constraint = parsers.tool_constraint(tools, wire_choice,
                                                 req.parallel_tool_calls is not False)
        parsers.start(tools if parse_tools else None, wire_choice, template_kwargs)
    except ValueError as exc:
        raise RequestError(f"tools: {exc}") from None
    return OutputPlan(
        template_tools=tools or None, constraint=constraint,
        new_parse=lambda: parsers.start(tools if parse_tools else None, wire_choice,
                                        template_kwargs))


def _check_choice(tools: list[dict[str, Any]], choice: Any, named: Optional[str],
                  parsers: Optional[ChatParsers]) -> None:
    forced = choice == "required" or named is not None
    if forced and not tools:
        raise RequestError("tool_choice: a required or named tool choice needs `tools`")
    if named is not None and named not in {t["function"]["name"] for t in tools}:
        raise RequestError(f"tool_choice: the named tool {named!r} is not among `tools`")
    if forced and (parsers is None or not parsers.parses_tool_calls):
        raise RequestError("tool_choice: a required or named tool choice needs a tool-call "
                           "parser; this worker was started without --tool-call-parser")


def add_constraint(params: dict[str, Any], constraint: Optional[tuple[str, str]]) -> None:
    """As SGLang does: a forced tool choice cannot share the output with another constraint."""
    if constraint is None:
        return
    taken = [key for key in CONSTRAINT_KEYS if params.get(key)]
    if taken:
        raise RequestError(
            "tool_choice: 'required' or a named tool cannot be combined with response_format "
            f"or guided decoding ({taken[0]}): both constrain the whole output")
    params[constraint[0]] = constraint[1]
