"""Text mode: engine chunks -> OpenAI `chat.completion.chunk` dicts.

Per choice `index`: `role` only on its first chunk, the engine's incremental `text` as
`content` (passed through, never re-sliced), `finish_reason` on its last. A usage chunk
(`choices: []`) closes the stream when the client asked for one; with
`stream_options.continuous_usage_stats` every chunk carries the usage so far too, as the 1.6.1
frontend does in Tokens mode. Usage counts the prompt once and the completions of all choices.
Logprobs, when asked for, ride with the text their tokens made (a token whose text the engine
still holds back, such as part of a multi-byte character, waits for the next chunk with text).
"""

import time
from typing import Any, Optional

from handlers.text.chat_outputs import ChoiceOutputs
from handlers.core.finish import map_finish_reason, matched_stop, usage_from_meta
from handlers.core.logprobs import ChatLogprobs
from protocol.outputs import (
    CHUNK_OBJECT,
    ChatChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatTokenLogprob,
    ChoiceLogprobs,
    CompletionUsage,
    PromptTokensDetails,
    to_wire,
)


class ChatStream:
    def __init__(self, chunk_id: str, model: str, include_usage: bool,
                 continuous_usage: bool = False,
                 logprobs: Optional[ChatLogprobs] = None,
                 outputs: Optional[ChoiceOutputs] = None, stop_reason: bool = False) -> None:
        self._id = chunk_id
        self._model = model
        self._created = int(time.time())
        self._include_usage = include_usage
        self._continuous_usage = continuous_usage
        self._started: set[int] = set()
        self._usage: dict[int, CompletionUsage] = {}
        self._logprobs = logprobs
        self._held: dict[int, list[ChatTokenLogprob]] = {}  # logprobs of text not sent yet
        self._outputs = outputs  # tool-call / reasoning parsing (handlers/text/chat_outputs.py)
        # `nvext.extra_fields` names "stop_reason": a choice's last chunk carries SGLang's
        # matched stop as `nvext.stop_reason`, as the frontend shows it in Tokens mode.
        self._stop_reason = stop_reason
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _chunk(self, choices: list[ChatChoice], usage: Optional[CompletionUsage] = None,
               nvext: Optional[dict[str, Any]] = None) -> dict:
        return to_wire(
            ChatCompletionChunk(
                id=self._id,
                created=self._created,
                model=self._model,
                object=CHUNK_OBJECT,
                choices=choices,
                usage=usage,
                nvext=nvext,
            )
        )

    def convert(self, chunk: dict[str, Any]) -> Optional[dict[str, Any]]:
        meta = chunk.get("meta_info") or {}
        reason = map_finish_reason(meta.get("finish_reason"))
        index = int(chunk.get("index") or 0)
        fields = {"content": chunk.get("text") or None}
        if self._outputs is not None:
            fields = self._outputs.take(index, chunk.get("text") or "", reason is not None)
            reason = self._outputs.finish_reason(index, reason)
        logprobs = self._take_logprobs(index, meta)
        if not any(fields.values()) and reason is None:
            if logprobs is not None:
                self._held[index] = logprobs.content
            return None
        first = index not in self._started
        self._started.add(index)
        if meta.get("completion_tokens") is not None:
            self._usage[index] = usage_from_meta(meta)
        delta = ChatDelta(role="assistant" if first else None, **fields)
        usage = self._total() if self._continuous_usage else None
        nvext = None
        if reason is not None and self._stop_reason:
            nvext = {"stop_reason": matched_stop(meta.get("finish_reason"))}
        return self._chunk([ChatChoice(index=index, delta=delta, finish_reason=reason,
                                       logprobs=logprobs)], usage, nvext)

    def _take_logprobs(self, index: int, meta: dict[str, Any]) -> Optional[ChoiceLogprobs]:
        if self._logprobs is None:
            return None
        new = self._logprobs.convert(meta)
        held = self._held.pop(index, None)
        if held is None:
            return new
        return ChoiceLogprobs(held + (new.content if new is not None else []))

    def close(self) -> Optional[dict[str, Any]]:
        """The usage chunk, when asked for."""
        usage = self._total()
        self.prompt_tokens, self.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        return self._chunk([], usage) if self._include_usage else None

    def _total(self) -> CompletionUsage:
        """The prompt counted once, completions summed over choices."""
        usages = list(self._usage.values())
        prompt = max((u.prompt_tokens for u in usages), default=0)
        completion = sum(u.completion_tokens for u in usages)
        cached = [
            u.prompt_tokens_details.cached_tokens for u in usages if u.prompt_tokens_details
        ]
        return CompletionUsage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(max(cached)) if cached else None,
        )


def asks_for(req: Any, field: str) -> bool:
    """Whether the body's `nvext.extra_fields` names ``field`` (the frontend's opt-in for its
    `nvext` response fields; names it does not know are ignored, as the frontend ignores them)."""
    nvext = getattr(req, "nvext", None)
    extra = (nvext.model_extra or {}).get("extra_fields") if nvext is not None else None
    return isinstance(extra, list) and field in extra
