"""Fakes for handler unit tests: an engine with SGLang's async_generate/abort_request surface,
a Dynamo-like context, and a prefill client; built from async generators, no real model."""

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, Optional

ABORT = {"type": "abort", "message": "Abort in waiting queue"}


def chunk(ids, finish=None, *, prompt=3, completion=0, cached=0, text=None, index=None) -> dict:
    out: dict[str, Any] = {
        "output_ids": list(ids),
        "meta_info": {
            "id": "engine-id",
            "finish_reason": finish,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cached_tokens": cached,
        },
    }
    if text is not None:
        out["text"] = text
    if index is not None:
        out["index"] = index
    return out


class FakeEngine:
    """Each request streams `chunks`; with hold=True it then waits until aborted (a request
    waiting for KV, or a long generation). abort_request(rid) ends the stream with an abort
    chunk, like SGLang."""

    def __init__(self, chunks=(), *, hold: bool = False, gate: Optional[asyncio.Event] = None):
        self.chunks = list(chunks)
        self.hold = hold
        self.gate = gate  # when set, chunks are released only after gate.set()
        self.calls: list[dict[str, Any]] = []
        self.aborts: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}
        self.tokenizer_manager = SimpleNamespace(abort_request=self._abort, tokenizer=None)

    async def async_generate(self, **kwargs: Any) -> AsyncIterator[dict]:
        self.calls.append(kwargs)
        event = self._abort_events.setdefault(kwargs["rid"], asyncio.Event())
        return self._stream(event)

    async def _stream(self, aborted: asyncio.Event) -> AsyncIterator[dict]:
        if self.gate is not None:
            await _first(self.gate.wait(), aborted.wait())
        for c in self.chunks:
            if aborted.is_set():
                break
            yield c
        if self.hold or aborted.is_set():
            await aborted.wait()
            yield chunk([], ABORT)

    def _abort(self, rid: str) -> None:
        self.aborts.append(rid)
        self._abort_events.setdefault(rid, asyncio.Event()).set()


async def _first(*aws) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()


class FakeContext:
    def __init__(self, rid: str = "ctx-1") -> None:
        self._id = rid
        self._stopped = False
        self._future: Optional[asyncio.Future] = None

    def id(self) -> str:
        return self._id

    def is_stopped(self) -> bool:
        return self._stopped

    def async_killed_or_stopped(self) -> asyncio.Future:
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self._stopped:
                self._future.set_result(True)
        return self._future

    def stop(self) -> None:
        self._stopped = True
        if self._future is not None and not self._future.done():
            self._future.set_result(True)


class FakePrefillClient:
    """`items(request)` is an async generator function producing the prefill stream."""

    def __init__(self, items: Callable[[dict], AsyncIterator[dict]]) -> None:
        self._items = items
        self.requests: list[dict] = []
        self.contexts: list[Any] = []
        self.closed = asyncio.Event()

    async def generate(self, request: dict, context: Any) -> AsyncIterator[dict]:
        self.requests.append(request)
        self.contexts.append(context)
        return self._wrap(request)

    async def _wrap(self, request: dict) -> AsyncIterator[dict]:
        try:
            async for item in self._items(request):
                yield item
        finally:
            self.closed.set()


BOOT = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 18998, "bootstrap_room": 12345}


async def collect(agen: AsyncIterator[dict], timeout: float = 5.0) -> list[dict]:
    async def run() -> list[dict]:
        return [item async for item in agen]

    return await asyncio.wait_for(run(), timeout)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition with a deadline (no sleeps as synchronization)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met within %.1f s" % timeout)
        await asyncio.sleep(0.005)
