"""A fake engine that behaves like SGLang 0.5.23's `Engine.async_generate(stream=True)` where the
handlers can tell: the request is validated and sent only on the stream's first read (a bad
parameter raises ValueError there), aborting an rid the TokenizerManager does not know is ignored,
n > 1 runs one sub-request per choice under fresh rids (so aborting the parent rid stops
nothing), and closing the stream aborts every sub-request it dispatched."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any


class SGLangLikeEngine:
    def __init__(self, tokens_per_choice: int = 1000, reject: str | None = None) -> None:
        self.tokens_per_choice = tokens_per_choice
        self.reject = reject  # a ValueError message raised on the first read
        self.live: dict[str, asyncio.Event] = {}  # rid -> aborted, like rid_to_state
        self.aborted: list[str] = []
        self.dispatched: list[str] = []
        self.tokenizer_manager = SimpleNamespace(abort_request=self._abort, tokenizer=None,
                                                 rid_to_state=self.live)

    async def async_generate(self, *, input_ids: list[int], sampling_params: dict[str, Any],
                             stream: bool, rid: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        assert stream
        return self._generate(rid, int(sampling_params.get("n") or 1),
                              int(sampling_params.get("max_new_tokens") or 1), len(input_ids))

    def _abort(self, rid: str) -> None:
        event = self.live.get(rid)
        if event is None or event.is_set():
            return  # SGLang: an unknown rid is ignored, an abort is sent once
        self.aborted.append(rid)
        event.set()

    async def _generate(self, rid: str, n: int, max_new: int,
                        prompt: int) -> AsyncIterator[dict[str, Any]]:
        if self.reject is not None:
            raise ValueError(self.reject)
        rids = [rid] if n == 1 else [uuid.uuid4().hex for _ in range(n)]
        for sub in rids:
            self.live[sub] = asyncio.Event()
            self.dispatched.append(sub)
        try:
            for step in range(min(max_new, self.tokens_per_choice)):
                for index, sub in enumerate(rids):
                    if sub not in self.live:
                        continue
                    if self.live[sub].is_set():
                        yield _chunk(sub, index if n > 1 else None, [], "abort", prompt, step)
                        return
                    done = step + 1 == max_new
                    if done:
                        self.live.pop(sub)  # finished: the scheduler's report removes it
                    yield _chunk(sub, index if n > 1 else None, [7], "length" if done else None,
                                 prompt, step + 1)
                await asyncio.sleep(0.001)  # a decode step
        finally:
            # SGLang's generate_request: on any exit, abort what was dispatched and not finished.
            for sub in rids:
                if sub in self.live:
                    self._abort(sub)
                    self.live.pop(sub)


def _chunk(rid: str, index: int | None, ids: list[int], finish: str | None, prompt: int,
           completion: int) -> dict[str, Any]:
    out: dict[str, Any] = {"output_ids": ids, "meta_info": {
        "id": rid, "finish_reason": None if finish is None else {"type": finish},
        "prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": 0}}
    if index is not None:
        out["index"] = index
    return out
