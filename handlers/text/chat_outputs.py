"""Text mode: a choice's generated text -> OpenAI delta fields, through the request's parsers
(handlers/text/tool_calls.py).

Streaming, each engine chunk's text is fed as it comes and whatever the parsers release goes
out at once (`reasoning_content`, `content`, `tool_calls` deltas: a call's first delta carries
its `id`, `type` and `name`, later ones more `arguments`). Not streaming, the text is kept and
parsed whole at the end, as SGLang's serving_chat does; the 1.6.1 frontend then assembles the
one chunk into the response. A choice that called a tool and stopped finishes with
`tool_calls`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Optional

from handlers.text.tool_calls import OutputParse, Parsed
from protocol.outputs import ChatFunctionDelta, ChatToolCallDelta


class ChoiceOutputs:
    def __init__(self, new_parse: Callable[[], Optional[OutputParse]], stream: bool) -> None:
        self._new_parse = new_parse
        self._stream = stream
        self._parses: dict[int, Optional[OutputParse]] = {}
        self._text: dict[int, list[str]] = {}  # not streaming: the choice's text so far
        self._call_ids: dict[tuple[int, int], str] = {}  # (choice, call) -> id

    def take(self, index: int, text: str, finished: bool) -> dict[str, Any]:
        """The delta fields for this chunk of choice `index` (none set: nothing to send)."""
        if index not in self._parses:
            self._parses[index] = self._new_parse()
        parse = self._parses[index]
        if parse is None:
            return {"content": text or None}
        if not self._stream:
            self._text.setdefault(index, []).append(text)
            if not finished:
                return {}
            return self._fields(index, parse.parse_all("".join(self._text.pop(index))))
        got = parse.feed(text) if text else Parsed()
        if finished:
            tail = parse.finish()
            got = Parsed(got.reasoning + tail.reasoning, got.content + tail.content,
                         got.calls + tail.calls)
        return self._fields(index, got)

    def finish_reason(self, index: int, reason: Optional[str]) -> Optional[str]:
        called = any(choice == index for choice, _ in self._call_ids)
        return "tool_calls" if reason == "stop" and called else reason

    def _fields(self, index: int, got: Parsed) -> dict[str, Any]:
        calls = [self._call_delta(index, call.index, call.name, call.arguments)
                 for call in got.calls]
        return {"reasoning_content": got.reasoning or None, "content": got.content or None,
                "tool_calls": calls or None}

    def _call_delta(self, choice: int, call: int, name: Optional[str],
                    arguments: str) -> ChatToolCallDelta:
        key = (choice, call)
        if key in self._call_ids:
            return ChatToolCallDelta(index=call, function=ChatFunctionDelta(arguments=arguments))
        self._call_ids[key] = call_id = f"call_{uuid.uuid4().hex[:24]}"
        return ChatToolCallDelta(index=call, id=call_id, type="function",
                                 function=ChatFunctionDelta(name=name, arguments=arguments))
