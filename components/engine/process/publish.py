"""What the engine process pushes to its subscribed worker (``wire.Subscribe``): the engine's
read-outs when they change, and its KV event listener's calls.

Pushed, not asked for: the worker reads its latest copy at scrape time without a round trip or a
blocking call on its event loop. Nothing is sent while the engine is idle (an idle worker must
not wake): the read-outs are compared every ``PUSH_INTERVAL_S`` from a request's arrival until
the engine holds no request and no page and they stopped changing, and once more ahead of each
request's final chunk
(``EngineService._relay``), so a caller that saw a request end reads read-outs that count it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from components.engine.process import wire

logger = logging.getLogger(__name__)

PUSH_INTERVAL_S = 0.02


def snapshot(engine: Any) -> wire.Readouts:
    """The engine's read-outs now (each a read of the engine thread's state, as at scrape time)."""
    t = engine.request_totals()
    transfers = engine.kv_transfer_totals()
    return wire.Readouts(
        kv_pages_in_use=engine.kv_pages_in_use(), kv_pages_cached=engine.kv_pages_cached(),
        requests_in_flight=engine.requests_in_flight(), queue_depth=engine.queue_depth(),
        prefix_hit_tokens=engine.prefix_hit_tokens(),
        totals=(t.requests, t.prompt_tokens, t.generation_tokens, t.cached_tokens),
        transfers=(None if transfers is None
                   else (transfers.writes, transfers.nbytes, transfers.seconds)))


class KvForwarder:
    """The engine's KV event listener in the engine process. Called on the engine thread, it only
    collects calls; one hop to the service's loop per batch sends them (``flush``), in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, flush: Callable[[list], None]) -> None:
        self._loop = loop
        self._flush = flush
        self._lock = threading.Lock()
        self._calls: list[tuple[str, list[Any]]] = []

    def blocks_stored(self, token_ids: list[int], block_hashes: list[int],
                      parent_hash: int | None) -> None:
        self._add("blocks_stored", [list(token_ids), list(block_hashes), parent_hash])

    def blocks_removed(self, block_hashes: list[int]) -> None:
        self._add("blocks_removed", [list(block_hashes)])

    def load(self, kv_used_pages: int, running: int, waiting: int) -> None:
        self._add("load", [kv_used_pages, running, waiting])

    def _add(self, name: str, args: list[Any]) -> None:
        with self._lock:
            first = not self._calls
            self._calls.append((name, args))
        if first:  # a hop is not yet on its way for this batch
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        if calls:
            self._flush(calls)


class ReadoutPublisher:
    """Sends ``wire.Readouts`` to the subscribed peers when they differ from the last sent."""

    def __init__(self, engine: Any, send: Callable[[bytes, Any], None],
                 busy: Callable[[], bool]) -> None:
        self._engine = engine
        self._send = send  # (peer, message): queued on the service's socket
        self._busy = busy
        self._peers: set[bytes] = set()
        self._last: wire.Readouts | None = None
        self._wake = asyncio.Event()

    def subscribe(self, peer: bytes) -> None:
        self._peers.add(peer)
        self._send(peer, self._last or snapshot(self._engine))

    def unsubscribe(self, peer: bytes) -> None:
        self._peers.discard(peer)

    def wake(self) -> None:
        """A request arrived: compare the read-outs until the engine is idle again (only for a
        subscriber: attached tokenizer workers do not subscribe)."""
        if self._peers:
            self._wake.set()

    def push(self) -> bool:
        """Send the read-outs if they changed; whether they did."""
        if not self._peers:
            return False
        now = snapshot(self._engine)
        if now == self._last:
            return False
        self._last = now
        for peer in self._peers:
            self._send(peer, now)
        return True

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            changed = True
            # Pages can outlive a request's relay (a prefill's KV WRITE completes after its last
            # chunk; an abort frees them a step later): compare until the engine is idle.
            while changed or self._busy() or not _idle(self._last):
                await asyncio.sleep(PUSH_INTERVAL_S)
                changed = self.push()


def _idle(readouts: wire.Readouts | None) -> bool:
    return readouts is None or not (readouts.kv_pages_in_use or readouts.requests_in_flight
                                    or readouts.queue_depth)
