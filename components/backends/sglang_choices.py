"""`n > 1` on a disaggregated `sglang.Engine`: one bootstrap room per choice.

SGLang 0.5.23's decode cannot fork an adopted request: a PD decode request receives one room's
KV into its own pages (`disaggregation/decode.py`: one `KVReceiver` per request), and its
TokenizerManager runs `n > 1` as a prefix warm-up (`max_new_tokens=0`) plus `n` copies of the
first sample's tokenized request, so every copy carries the one room it was given
(`GenerateReqInput` expands a scalar room to `room + i` per sample, but the copies are made
from sample 0): `n + 1` requests would meet in one room. So a request with `n > 1` and a room
runs here as `n` requests with `n = 1` in rooms `room`, `room + 1`, ... (SGLang's own
`room + i` convention), on both legs, which derive the same rooms from the one room the
frontend or the prefill drew. The prefill first puts the prompt in its radix cache with one
request to SGLang's fake bootstrap host (no decode, no transfer: SGLang's own `n > 1`
warm-up), so each choice's prefill recomputes only the prompt's last token; each choice's KV
still moves in a transfer of its own. Chunks are tagged with the choice's `index`, as SGLang
tags its own `n > 1` stream; closing or cancelling the stream aborts every choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, choice_room


class RoomPerChoice:
    """A disaggregated `sglang.Engine`, `n > 1` run one room per choice; all else as SGLang."""

    def __init__(self, engine: Any, prefill: bool) -> None:
        self._engine = engine
        self._prefill = prefill

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def async_generate(self, **kwargs: Any) -> Any:
        n = int((kwargs.get("sampling_params") or {}).get("n") or 1)
        room = kwargs.get("bootstrap_room")
        if n <= 1 or room is None or kwargs.get("bootstrap_host") == FAKE_BOOTSTRAP_HOST:
            return await self._engine.async_generate(**kwargs)
        if not kwargs.get("stream"):
            raise ValueError("n > 1 on a disaggregated SGLang engine is served streamed only")
        return self._choices(kwargs, n, room)

    async def _choices(self, kwargs: dict[str, Any], n: int, room: int
                       ) -> AsyncIterator[dict[str, Any]]:
        one = {**kwargs["sampling_params"], "n": 1}
        rid = kwargs.get("rid")
        if self._prefill:
            await self._warm_prefix(kwargs, one, rid)
        streams = []
        for i in range(n):
            sub = {**kwargs, "sampling_params": one, "bootstrap_room": choice_room(room, i),
                   "rid": f"{rid}-{i}" if rid else None}
            streams.append(await self._engine.async_generate(**sub))
        async with aclosing(merge(streams)) as chunks:  # closing this stream closes every choice
            async for chunk in chunks:
                yield chunk

    async def _warm_prefix(self, kwargs: dict[str, Any], one: dict[str, Any],
                           rid: Any) -> None:
        warm = {**kwargs, "sampling_params": {**one, "max_new_tokens": 1},
                # room 0: SGLang's "no room", never one a real request's transfer uses
                "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": 0, "stream": True,
                "rid": f"{rid}-warm" if rid else None}
        stream = await self._engine.async_generate(**warm)
        try:
            async for _ in stream:
                pass
        finally:
            await stream.aclose()


async def merge(streams: list[AsyncIterator[dict[str, Any]]]
                ) -> AsyncIterator[dict[str, Any]]:
    """The choices' chunks as they come, each tagged with its choice's `index`; on the way out
    (done, closed or cancelled) every stream still open is cancelled and closed, which aborts
    its request in SGLang."""
    reads = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while reads:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = reads.pop(task)
                try:
                    chunk = task.result()
                except StopAsyncIteration:
                    continue
                chunk["index"] = i
                yield chunk
                reads[asyncio.ensure_future(anext(streams[i]))] = i
    finally:
        for task in reads:
            task.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
