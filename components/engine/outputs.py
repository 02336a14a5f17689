"""Engine-thread side of output delivery: chunk dicts, and batched wake-ups of asyncio loops."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from components.engine.sequence import Sequence

logger = logging.getLogger(__name__)


def finish_stop_token(token: int) -> dict[str, Any]:
    return {"type": "stop", "matched": token}


def finish_stop_str(stop: str) -> dict[str, Any]:
    return {"type": "stop", "matched": stop}


def finish_length(n: int) -> dict[str, Any]:
    return {"type": "length", "length": n}


def finish_abort(message: str, status_code: int | None = None) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status_code}


def build_chunk(seq: Sequence, with_text: bool, output_ids: list[int], text: str) -> dict[str, Any]:
    """One SGLang incremental-stream chunk (DESIGN.md section 4)."""
    meta: dict[str, Any] = {
        "id": seq.rid,
        "finish_reason": seq.finish_reason,
        "prompt_tokens": seq.prompt_len,
        "completion_tokens": len(seq.output_ids),
        "cached_tokens": 0,
    }
    if seq.finish_reason is not None:
        meta["e2e_latency"] = time.perf_counter() - seq.created_at
    chunk: dict[str, Any] = {"output_ids": output_ids, "meta_info": meta}
    if with_text:
        chunk["text"] = text
    return chunk


class LoopBatcher:
    """Collects items per asyncio loop during one engine step; wakes each loop once per flush.

    One ``call_soon_threadsafe`` per loop and step (not per chunk) keeps the embedding loop's
    wake-ups, and the GIL hand-offs they cost, independent of the batch size.
    """

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}

    def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: Any) -> None:
        self._pending.setdefault(loop, []).append((queue, item))

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                # The caller's loop is closed: nobody is listening any more.
                logger.debug("dropping %d chunk(s) for a closed event loop", len(items))


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
