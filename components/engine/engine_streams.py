"""How a request's chunks reach its caller, with SGLang's semantics (sglang.Engine 0.5.x):

- ``stream=True`` returns an async generator and nothing is sent until its first read (an abort
  of the rid before that finds nothing, as SGLang's TokenizerManager ignores unknown rids);
- a request refused before it runs (bad sampling parameters, input too long, ...) raises
  ``ValueError`` with the message, on the first read or from the awaited call;
- a 400 abort after chunks went out is the stream's last chunk; without streaming it raises;
- a consumer that stops reading (closes, is cancelled) aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Chunk = dict[str, Any]
# Starts the request on the engine thread; -> the queue its chunks arrive on. Raises ValueError
# when it is refused before reaching the engine (duplicate rid, invalid parameters, a grammar
# that does not compile).
Start = Callable[[], Awaitable[asyncio.Queue]]
Abort = Callable[[], None]


async def stream_chunks(start: Start, abort: Abort) -> AsyncIterator[Chunk]:
    queue = await start()
    finished = False
    first = True
    try:
        while not finished:
            chunk = await queue.get()
            finished = chunk["meta_info"]["finish_reason"] is not None
            if first and finished:
                _raise_if_refused(chunk)
            first = False
            yield chunk
    finally:
        if not finished:  # closed or cancelled by the consumer: abort, as SGLang does
            abort()


async def final_chunk(start: Start, abort: Abort) -> Chunk:
    queue = await start()
    try:
        while True:
            chunk = await queue.get()
            if chunk["meta_info"]["finish_reason"] is not None:
                _raise_if_refused(chunk)
                return chunk
    except asyncio.CancelledError:  # the request must not keep running (and holding KV)
        abort()
        raise


def _raise_if_refused(chunk: Chunk) -> None:
    reason = chunk["meta_info"]["finish_reason"]
    if reason["type"] == "abort" and reason.get("status_code") == 400:
        raise ValueError(reason["message"])
