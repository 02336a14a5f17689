"""How a request's chunks reach its caller, with SGLang's semantics (sglang.Engine 0.5.x):

- ``stream=True`` returns an async generator and nothing is sent until its first read (an abort
  of the rid before that finds nothing, as SGLang's TokenizerManager ignores unknown rids);
- a request refused before it runs (bad sampling parameters, input too long, ...) raises
  ``ValueError`` with the message, on the first read or from the awaited call;
- a 400 abort after chunks went out is the stream's last chunk; without streaming it raises;
- a consumer that stops reading (closes, is cancelled) aborts the request;
- with ``n > 1`` the stream carries every choice's chunks (each tagged ``index``) until all have
  finished, and without streaming the result is the list of the choices' final outputs;
- chunks that queued up while the consumer was busy are read as one (their ids and text joined,
  the latest meta_info, incremental logprob lists joined), as SGLang's TokenizerManager
  coalesces an incremental stream's backlog (one choice's only:
  with ``n > 1`` the choices' chunks interleave): fewer items cross into the caller (and Dynamo's
  runtime) per token, and nothing waits for a merge, so the first token is never delayed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from components.engine.core.forks import strip_index

Chunk = dict[str, Any]
# Starts the request on the engine thread; -> the queue its chunks arrive on. Raises ValueError
# when it is refused before reaching the engine (duplicate rid, invalid parameters, a grammar
# that does not compile).
Start = Callable[[], Awaitable[asyncio.Queue]]
Abort = Callable[[], None]


async def stream_chunks(start: Start, abort: Abort, choices: int = 1) -> AsyncIterator[Chunk]:
    queue = await start()
    finished = 0
    first = True
    try:
        while finished < choices:
            chunk = await queue.get()
            while (choices == 1 and chunk["meta_info"]["finish_reason"] is None
                   and not queue.empty()):
                chunk = _merge(chunk, queue.get_nowait())
            done = chunk["meta_info"]["finish_reason"] is not None
            if first and done:
                raise_if_refused(chunk)
            first = False
            finished += done
            yield chunk
    finally:
        if finished < choices:  # closed or cancelled by the consumer: abort, as SGLang does
            abort()


async def final_chunk(start: Start, abort: Abort, choices: int = 1) -> Chunk | list[Chunk]:
    queue = await start()
    finals: list[Chunk] = []
    try:
        while True:
            chunk = await queue.get()
            if chunk["meta_info"]["finish_reason"] is not None:
                raise_if_refused(chunk)
                finals.append(chunk)
                if choices == 1:
                    return chunk
                if len(finals) == choices:
                    return strip_index(finals)
    except asyncio.CancelledError:  # the request must not keep running (and holding KV)
        abort()
        raise


# meta_info keys that, like output_ids, carry only the new tokens' entries in an incremental
# stream (SGLang 0.5.23's _INCREMENTAL_STREAMING_META_INFO_KEYS).
_INCREMENTAL_META = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs",
                     "output_token_sampling_mask", "output_token_sampling_logprobs")


def _merge(first: Chunk, later: Chunk) -> Chunk:
    """One chunk carrying `first`'s then `later`'s new tokens (both of one request, in order)."""
    merged = dict(later)
    merged["output_ids"] = first["output_ids"] + later["output_ids"]
    if "text" in first:
        merged["text"] = first["text"] + later.get("text", "")
    meta, old = dict(later["meta_info"]), first["meta_info"]
    for key in _INCREMENTAL_META:
        if isinstance(old.get(key), list) and isinstance(meta.get(key, []), list):
            meta[key] = old[key] + meta.get(key, [])
    merged["meta_info"] = meta
    return merged


def raise_if_refused(chunk: Chunk) -> None:
    reason = chunk["meta_info"]["finish_reason"]
    if reason["type"] == "abort" and reason.get("status_code") == 400:
        raise ValueError(reason["message"])
