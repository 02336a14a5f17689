"""A prefill leg's engine request: its stream read to the end (`drain_engine`), and the leg's
room-watch state (`PrefillLeg`). Split from handlers/prefill.py, which uses them."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional

from handlers.core.base import RoomEnd
from handlers.core.errors import EngineError
from handlers.core.finish import map_finish_reason
from handlers.core.guard import END, RequestGuard, next_item
from handlers.disagg.prompt_logprobs import PrefillSide
from protocol.disagg import PrefillDone


async def drain_engine(
    stream: AsyncIterator[dict[str, Any]], guard: RequestGuard,
    prompt: Optional[PrefillSide] = None,
) -> PrefillDone:
    """Read the engine stream to its end; the last chunk's meta carries the counts, and
    the prompt logprobs when asked (sent on to the decode half at once)."""
    meta: dict[str, Any] = {}
    reason, why_none = None, "the prefill engine failed the request"
    try:
        while (chunk := await next_item(stream)) is not END:
            meta = chunk.get("meta_info") or meta
            reason = map_finish_reason(meta.get("finish_reason")) or reason
            if prompt is not None:
                prompt.seen(meta)
        why_none = "the prefill engine aborted the request" if reason == "cancelled" else ""
    finally:
        if prompt is not None:  # also when it failed: the decode then fails at once
            prompt.deliver(why_none)
    guard.finish()
    if reason == "cancelled":
        guard.check()  # Stopped when the client went away
        raise EngineError("prefill engine aborted the request")
    return PrefillDone(
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )


@dataclass
class PrefillLeg:
    """A prefill leg's room watch (None: unwatched) and whether it ends before its engine
    request does (`early`: an `n > 1` frontend leg; `detached` once a task owns the rest)."""

    gone: "Optional[asyncio.Future[RoomEnd]]"
    early: bool = False
    detached: bool = False
    # An early leg's end goes to the decode once its stream ended and its engine request is
    # through, whichever comes second (handlers/disagg/leg_end.py says why both).
    waiting: set[str] = field(default_factory=lambda: {"stream", "engine"})

    def through(self, part: str) -> bool:
        """`part` ("stream" or "engine") is over; True once both are."""
        self.waiting.discard(part)
        return not self.waiting


def refused(drain: "asyncio.Task[PrefillDone]") -> bool:
    """SGLang validates a request on the stream's first read (ValueError): then no decode
    must be sent to a room that will never be served."""
    return drain.done() and not drain.cancelled() and isinstance(drain.exception(), ValueError)
