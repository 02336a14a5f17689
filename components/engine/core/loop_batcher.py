"""Delivery of chunks from the engine thread to asyncio loops: one wake-up per loop per step."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)


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
