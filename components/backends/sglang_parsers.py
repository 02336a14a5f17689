"""SGLang's own tool-call and reasoning parsers (`--tool-call-parser`, `--reasoning-parser`,
SGLang's names and meanings) behind the handlers' `ChatParsers` (handlers/text/tool_calls.py), for
Text mode on either engine: the CPU engine's worker imports sglang only when one is set.

Each choice gets fresh parsers, run as SGLang's serving_chat runs them: the reasoning parser
first, its normal text into the function-call parser; `finish` flushes what either held back.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Optional

from pydantic import ValidationError
from sglang.srt.entrypoints.openai.protocol import Tool, ToolChoice
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser

from handlers.text.tool_calls import Parsed, ToolCallDelta
from protocol.structural_tag import structural_tag_arg

_MAX_DRAIN_STEPS = 256  # detector steps per chunk: a call takes two (name, arguments)


def tool_parser_names() -> list[str]:
    return sorted(FunctionCallParser.ToolCallParserEnum)


def reasoning_parser_names() -> list[str]:
    return sorted(ReasoningParser.DetectorMap)


def check_parser_names(tool_call_parser: Optional[str], reasoning_parser: Optional[str]) -> None:
    """At startup: an unknown name stops the worker, naming the flag and SGLang's names."""
    for flag, value, names in (("--tool-call-parser", tool_call_parser, tool_parser_names()),
                               ("--reasoning-parser", reasoning_parser,
                                reasoning_parser_names())):
        if value is not None and value not in names:
            raise SystemExit(f"{flag} {value!r} is not one of SGLang's parsers: "
                             f"{', '.join(names)}")


def _force_reasoning(mode: Optional[str], kwargs: dict[str, Any]) -> bool:
    """SGLang's default when the chat template declares no thinking toggle of its own
    (serving_chat `_get_reasoning_from_request`): the detector's `reasoning_default`."""
    if mode == "always":
        return True
    if mode in ("thinking", "enable_thinking"):
        return kwargs.get(mode) is not False
    if mode in ("explicit_thinking", "explicit_enable_thinking"):
        return kwargs.get(mode.replace("explicit_", "")) is True
    return False


class _ChoiceParse:
    def __init__(self, reasoning: Optional[ReasoningParser],
                 tools: Optional[FunctionCallParser]) -> None:
        self._reasoning = reasoning
        self._tools = tools

    def feed(self, text: str) -> Parsed:
        reasoning, normal = "", text
        if self._reasoning is not None:
            got_reasoning, got_normal = self._reasoning.parse_stream_chunk(text)
            reasoning, normal = got_reasoning or "", got_normal or ""
        return self._tool_step(reasoning, normal, end=False)

    def finish(self) -> Parsed:
        reasoning, normal = "", ""
        if self._reasoning is not None:
            got_reasoning, got_normal = self._reasoning.parse_stream_end()
            reasoning, normal = got_reasoning or "", got_normal or ""
        return self._tool_step(reasoning, normal, end=True)

    def _tool_step(self, reasoning: str, normal: str, end: bool) -> Parsed:
        if self._tools is None:
            return Parsed(reasoning, normal)
        content, calls = "", []
        piece = normal
        # A detector takes one step per call: a chunk that carried a whole call (chunks
        # coalesce when the reader lags) yields its name now and its arguments on the next
        # call, so drain what it holds with empty increments until it yields nothing.
        for _ in range(_MAX_DRAIN_STEPS):
            if not piece and not calls and not end:
                break
            got_content, got_calls = self._tools.parse_stream_chunk(piece)
            content += got_content or ""
            calls += list(got_calls)
            if not got_calls:
                break
            piece = ""
        if end:
            tail, more = self._tools.parse_stream_end()
            content, calls = content + (tail or ""), calls + list(more)
        return Parsed(reasoning, content, [_delta(c) for c in calls])

    def parse_all(self, text: str) -> Parsed:
        reasoning, normal = "", text
        if self._reasoning is not None:
            got_reasoning, got_normal = self._reasoning.parse_non_stream(text)
            reasoning, normal = got_reasoning or "", got_normal or ""
        if self._tools is None or not normal:
            return Parsed(reasoning, normal)
        content, calls = self._tools.parse_non_stream(normal)
        return Parsed(reasoning, content or "",
                      [ToolCallDelta(i, c.name, c.parameters or "") for i, c in enumerate(calls)])


def _delta(item: Any) -> ToolCallDelta:
    return ToolCallDelta(int(item.tool_index), item.name or None, item.parameters or "")


def _choice(tool_choice: Any) -> Any:
    return ToolChoice(**tool_choice) if isinstance(tool_choice, dict) else tool_choice


class SglangChatParsers:
    def __init__(self, tool_call_parser: Optional[str], reasoning_parser: Optional[str],
                 tokenizer: Any, whitespace: Optional[dict[str, Any]] = None) -> None:
        check_parser_names(tool_call_parser, reasoning_parser)
        self._whitespace = whitespace or {}  # structural_tag_arg's JSON whitespace settings
        self._tool_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        self._tokenizer = tokenizer
        self.parses_tool_calls = tool_call_parser is not None
        self.parses_reasoning = reasoning_parser is not None
        self._reasoning_default = None
        if reasoning_parser is not None:
            detector = ReasoningParser(reasoning_parser, tokenizer=tokenizer).detector
            self._reasoning_default = getattr(detector, "reasoning_default", None)

    def _tools(self, tools: list[dict[str, Any]]) -> list[Tool]:
        try:
            return [Tool(**tool) for tool in tools]
        except ValidationError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None

    def _function_parser(self, tools: list[dict[str, Any]], tool_choice: Any
                         ) -> FunctionCallParser:
        return FunctionCallParser(self._tools(tools), self._tool_parser,
                                  tokenizer=self._tokenizer, tool_choice=_choice(tool_choice))

    def tool_constraint(self, tools: list[dict[str, Any]], tool_choice: Any,
                        parallel_tool_calls: bool) -> Optional[tuple[str, str]]:
        parser = self._function_parser(tools, tool_choice)
        constraint = parser.get_structure_constraint(_choice(tool_choice),
                                                     parallel_tool_calls=parallel_tool_calls)
        if constraint is None:
            return None
        kind, value = constraint
        if hasattr(value, "model_dump_json"):
            value = value.model_dump_json(by_alias=True)
        elif not isinstance(value, str):
            value = json.dumps(value)
        if kind == "structural_tag":
            value = structural_tag_arg(value, **self._whitespace)
        return kind, value

    def start(self, tools: Optional[list[dict[str, Any]]], tool_choice: Any,
              template_kwargs: dict[str, Any]) -> _ChoiceParse:
        function_parser = (self._function_parser(tools, tool_choice)
                           if tools and self.parses_tool_calls else None)
        reasoning_parser = None
        if self._reasoning_parser is not None:
            reasoning_parser = ReasoningParser(
                self._reasoning_parser, stream_reasoning=True,
                force_reasoning=_force_reasoning(self._reasoning_default, template_kwargs),
                request=SimpleNamespace(chat_template_kwargs=template_kwargs),
                tokenizer=self._tokenizer, tool_call_parser_active=function_parser is not None)
        return _ChoiceParse(reasoning_parser, function_parser)
