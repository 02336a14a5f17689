"""Where each prefill worker keeps its room watch, asked over Dynamo
(docs/reference/room-watch.md).

The frontend's `bootstrap_info` names only a prefill's bootstrap server. Every prefill worker
also serves `<namespace>.<prefill component>.room_watch`, which answers one item
{bootstrap_host, bootstrap_port, watch_host, watch_port}; the decode worker asks each instance
once (a new instance id, e.g. a restarted prefill, is asked anew) and maps bootstrap servers to
watch servers. Works on every discovery backend and request plane, as the frontend's own calls.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Optional

from components.worker.rooms.claims import Address

logger = logging.getLogger(__name__)

ENDPOINT = "room_watch"
ASK_TIMEOUT_S = 2.0


def room_watch_endpoint(prefill_endpoint: str) -> str:
    namespace, component, _ = prefill_endpoint.split(".")
    return f"{namespace}.{component}.{ENDPOINT}"


def room_watch_answer(bootstrap: tuple[str, int], watch: Address):
    """The prefill worker's endpoint: one item, its two addresses."""

    async def answer(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        yield {"bootstrap_host": bootstrap[0], "bootstrap_port": bootstrap[1],
               "watch_host": watch[0], "watch_port": watch[1]}

    return answer


class RoomDirectory:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._watch: dict[tuple[str, int], Address] = {}
        self._asked: set[int] = set()
        self._refreshing: Optional[asyncio.Future[None]] = None

    async def lookup(self, host: str, port: int) -> Optional[Address]:
        found = self._watch.get((host, port))
        if found is None:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._refresh())
            await asyncio.shield(self._refreshing)
            found = self._watch.get((host, port))
            if found is None:
                logger.warning("no prefill worker's room watch serves bootstrap %s:%d", host, port)
        return found

    async def _refresh(self) -> None:
        ids = set(self._client.instance_ids())
        self._asked &= ids
        new = sorted(ids - self._asked)
        answers = await asyncio.gather(*(self._ask(i) for i in new), return_exceptions=True)
        for instance_id, answer in zip(new, answers):
            if isinstance(answer, BaseException):
                logger.warning("prefill instance %x did not say where its room watch is: %r",
                               instance_id, answer)
                continue
            self._asked.add(instance_id)
            self._watch[(answer["bootstrap_host"], int(answer["bootstrap_port"]))] = (
                answer["watch_host"], int(answer["watch_port"]))

    async def _ask(self, instance_id: int) -> dict[str, Any]:
        async def first() -> dict[str, Any]:
            stream = await self._client.direct({}, instance_id, annotated=False)
            async for item in stream:
                return item
            raise ValueError("empty answer")

        return await asyncio.wait_for(first(), ASK_TIMEOUT_S)
