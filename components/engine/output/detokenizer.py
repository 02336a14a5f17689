"""Incremental detokenization into text deltas, with stop-string matching.

Deltas never end in half a UTF-8 character: a byte-level BPE token can carry part of one, and
decoding then ends in U+FFFD; that text is held back until the next token completes it
(SGLang/vLLM prefix/read offsets). Text that could be the start of a stop string is held back
until it is resolved, and a matched stop string is not emitted (unless ``no_stop_trim``).
"""

from __future__ import annotations

from typing import Any

# Prompt tokens decoded ahead of the output, so the first output token gets its leading space
# the way a sentencepiece tokenizer renders it in context (SGLang uses 5).
CONTEXT_TOKENS = 5
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Token ids in, complete-character text deltas out."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._kw = {
            "skip_special_tokens": skip_special_tokens,
            "spaces_between_special_tokens": spaces_between_special_tokens,
        }
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        try:
            return self._tok.decode(ids, **self._kw)
        except TypeError:  # tokenizers without spaces_between_special_tokens
            return self._tok.decode(ids, skip_special_tokens=self._kw["skip_special_tokens"])

    def add(self, token_id: int) -> str:
        """Feed one token; return the text it completes (may be "")."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the request: whatever is still held back, even if incomplete."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) and not final:
            return ""
        if new_text.endswith(REPLACEMENT) and not final:
            return ""
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta


class StopStringMatcher:
    """Buffers text deltas; releases text that cannot be part of a stop string."""

    def __init__(self, stops: tuple[str, ...], no_stop_trim: bool = False) -> None:
        self._stops = stops
        self._no_trim = no_stop_trim
        self._pending = ""

    def push(self, delta: str) -> tuple[str, str | None]:
        """-> (text safe to emit, the matched stop string or None)."""
        if not self._stops:
            return delta, None
        self._pending += delta
        best: tuple[int, str] | None = None
        for stop in self._stops:
            i = self._pending.find(stop)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            emit = self._pending[:i] + (stop if self._no_trim else "")
            self._pending = ""
            return emit, stop
        hold = self._held_suffix_len()
        cut = len(self._pending) - hold
        emit, self._pending = self._pending[:cut], self._pending[cut:]
        return emit, None

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

    def _held_suffix_len(self) -> int:
        """Length of the longest tail of the buffer that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:k]):
                    best = k
                    break
        return best
