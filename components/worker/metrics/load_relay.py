"""Load for Dynamo's KV router and planner on `--engine sglang`: KV blocks in use per DP rank,
read from SGLang's schedulers and published with Dynamo's `WorkerMetricsPublisher`.

Dynamo 1.6.1's own worker receives the schedulers' metrics as pickled objects over ZMQ; this
relay reads the load snapshots SGLang's schedulers keep in shared memory (msgspec, no pickle)
instead, a few times a second, and publishes a rank's value only when it changed. The CPU
engine needs none of this: it reports its load to its KV event listener (kv_events.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from components.backends.base import EngineBackend

logger = logging.getLogger(__name__)

POLL_S = 0.25


class LoadRelay:
    def __init__(self, backend: EngineBackend, engine: Any, page_size: int,
                 publisher: Any) -> None:
        self._read = lambda: backend.kv_used_blocks(engine, page_size)
        self._publisher = publisher
        self._published: dict[int, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def step(self) -> None:
        """Publish each rank whose blocks in use changed since the last publish."""
        for rank, blocks in (self._read() or {}).items():
            if self._published.get(rank) != blocks:
                self._publisher.publish(rank, kv_used_blocks=blocks)
                self._published[rank] = blocks

    async def _run(self) -> None:
        while True:
            try:
                self.step()
            except Exception as exc:  # the bindings raise bare Exceptions; routing goes on
                logger.warning("publishing SGLang's load for the router failed: %s", exc)
            await asyncio.sleep(POLL_S)
