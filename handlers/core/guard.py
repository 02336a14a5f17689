"""One engine request's lifetime: abort it by rid (at most once) when the client goes away,
when the request fails elsewhere (the prefill leg), or when the handler ends early; and
bounded waits that give up as soon as any of that happens."""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Optional, TypeVar

from handlers.core.base import Context, Engine
from handlers.core.live import LiveRequests

logger = logging.getLogger(__name__)

T = TypeVar("T")
END = object()  # what next_item returns when the stream is exhausted


class Stopped(Exception):
    """The client stopped the request: end quietly, yield nothing more."""


async def next_item(stream: AsyncIterator[T]) -> Any:
    """anext() that returns END instead of raising StopAsyncIteration (safe inside a Task)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return END


async def aclose(items: Any) -> None:
    """Close a stream (the engine's, a prefill's) if it can be; never raises an Exception."""
    close = getattr(items, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception as exc:  # cleanup of a foreign iterator must not mask the real outcome
        logger.debug("closing the prefill stream failed: %r", exc)


class RequestGuard:
    def __init__(self, engine: Engine, rid: str, context: Optional[Context],
                 live: Optional[LiveRequests] = None) -> None:
        self._engine = engine
        self.rid = rid
        self._context = context
        self._live = live
        # Resolved once the request is interrupted (a failure, an end, the client stopping):
        # one future every wait of this request shares, rather than a task per wait.
        self._interrupt: Optional[asyncio.Future[None]] = None
        self._interrupted = False
        self._watch: Optional[asyncio.Future[Any]] = None
        self._client_stopped = False
        self._engine_started = False
        self._aborted = False
        self._finished = False
        self._progressing = False
        self.error: Optional[Exception] = None
        self.stream: Optional[AsyncIterator[Any]] = None  # the engine's; the handler closes it

    def start(self) -> None:
        """Watch the context, so a stop aborts the engine even before its first chunk."""
        if self._live is not None:
            self._live.add(self)
        if self._context is not None and hasattr(self._context, "async_killed_or_stopped"):
            # The runtime's own future (Dynamo's Context returns one): a callback, not a task.
            self._watch = asyncio.ensure_future(self._context.async_killed_or_stopped())
            self._watch.add_done_callback(self._context_done)

    def _context_done(self, watch: "asyncio.Future[Any]") -> None:
        if watch.cancelled() or watch.exception() is not None:  # closed, or the runtime's end
            return
        self._client_stopped = True
        self._set_interrupted()
        self.abort("client stopped")

    def _set_interrupted(self) -> None:
        self._interrupted = True
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(None)

    def _interrupt_future(self) -> "asyncio.Future[None]":
        if self._interrupt is None:
            self._interrupt = asyncio.get_running_loop().create_future()
            if self._interrupted:
                self._interrupt.set_result(None)
        return self._interrupt

    @property
    def stopped(self) -> bool:
        if self._client_stopped:
            return True
        ctx = self._context
        if ctx is not None and ctx.is_stopped():
            self._client_stopped = True
            self._set_interrupted()
        return self._client_stopped

    def check(self) -> None:
        """Raise the recorded failure, or Stopped if the client went away."""
        if self.error is not None:
            raise self.error
        if self.stopped:
            raise Stopped()

    def engine_started(self) -> None:
        self._engine_started = True
        if self._interrupted:
            self.abort("interrupted while starting")

    def progressing(self) -> None:
        """The engine produced output: failures elsewhere (fail()) no longer concern it."""
        self._progressing = True

    def fail(self, error: Exception) -> None:
        """Another part of the request failed: abort the engine and make waits raise `error`."""
        if self._finished or self._progressing or self.stopped or self.error is not None:
            if self.error is None and not self.stopped:
                logger.debug("request %s: ignored late failure %s", self.rid, error)
            return
        self.error = error
        self._set_interrupted()
        self.abort("failed: %s" % error)

    def end(self, error: Exception) -> None:
        """The worker ends the request (its drain time ran out, its engine is gone): abort the
        engine and make the handler raise `error`, also mid-stream."""
        if self._finished or self.error is not None or self.stopped:
            return
        self.error = error
        self._set_interrupted()
        self.abort("ended: %s" % error)

    def finish(self) -> None:
        """The engine finished the request; nothing to abort any more."""
        self._finished = True

    def abort(self, why: str) -> None:
        if self._aborted or self._finished or not self._engine_started:
            return
        self._aborted = True
        logger.info("aborting engine request %s (%s)", self.rid, why)
        self._engine.tokenizer_manager.abort_request(self.rid)

    def close(self) -> None:
        if self._live is not None:
            self._live.discard(self)
        if self._watch is not None:
            self._watch.cancel()
        self.abort("handler closed before the engine finished")

    async def race(self, awaitable: Awaitable[T], timeout: float) -> T:
        """Await `awaitable`, but raise the failure / Stopped as soon as the request is
        interrupted, and TimeoutError after `timeout` seconds (the awaited work is cancelled)."""
        self.check()  # before the work exists: a coroutine would be left unawaited
        work = asyncio.ensure_future(awaitable)
        try:
            await self.first_done({work}, timeout)
        except BaseException:  # interrupted, timed out, or our own task cancelled
            work.cancel()
            raise
        return work.result()

    async def first_done(self, futures: "set[asyncio.Future[Any]]", timeout: float) -> None:
        """Return once one of `futures` is done, as race() does, but neither wrapping nor
        cancelling them (they belong to the caller): Stopped or the failure as soon as the
        request is interrupted, TimeoutError after `timeout` seconds."""
        self.check()
        await asyncio.wait({*futures, self._interrupt_future()}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        if any(f.done() for f in futures):
            return
        self.check()
        raise TimeoutError(f"no result within {timeout:g} s")
