"""Where the handlers meet Dynamo's runtime.

- `RuntimePrefillClient` adapts Dynamo's `Client` to the handlers' `PrefillClient` protocol:
  plain-dict streams, a child context linked to the request's, and a retry over instances that
  refuse connections (a killed prefill stays listed in file discovery until its entry is removed);
  a prefill's `InvalidArgument` (a request its engine refused) becomes the handlers' `RequestError`.
- `translate_errors` wraps a handler's `generate`: `RequestError` becomes Dynamo's
  `InvalidArgument` (HTTP 400 with the message); other failures stay exceptions (HTTP 500).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Optional

from dynamo._core import Context
from dynamo.llm.exceptions import InvalidArgument

from handlers.errors import RequestError

logger = logging.getLogger(__name__)

Handler = Callable[..., AsyncIterator[dict[str, Any]]]

# The runtime reports a refused connection as a plain Exception with this prefix (1.6.1).
_CONNECT_FAILED = "Unavailable: TCP connection"


def is_connect_error(exc: BaseException) -> bool:
    return str(exc).startswith(_CONNECT_FAILED)


class RuntimePrefillClient:
    """`await generate(request, context)` -> async iterator of the prefill worker's dicts."""

    def __init__(self, client: Any, connect_timeout: float = 5.0) -> None:
        self._client = client
        self._connect_timeout = connect_timeout
        self._dead: set[int] = set()  # instances that refused a connection
        self._next = 0

    def live_instances(self) -> list[int]:
        return [i for i in self._client.instance_ids() if i not in self._dead]

    async def wait_for_instance(self, timeout: float) -> list[int]:
        """Bounded wait until at least one prefill instance is listed."""
        return await asyncio.wait_for(self._client.wait_for_instances(), timeout)

    async def generate(
        self, request: dict[str, Any], context: Optional[Any]
    ) -> "PrefillStream":
        child = context.detached(f"{context.id()}-prefill") if context is not None else Context()
        # Linked from the moment the request may have left: a client that goes away while the
        # prefill is still being reached (or before its stream is read) must stop it too,
        # or the prefill would hold its KV until its bootstrap wait runs out.
        watcher = asyncio.ensure_future(_link(context, child)) if context is not None else None
        try:
            stream, first = await self._open(request, child)
        except BaseException as exc:
            _unlink(watcher, child, completed=False)
            if isinstance(exc, InvalidArgument):
                # The prefill's engine refused the request (SGLang validates it there first):
                # the client's error, with the prefill's message, not a prefill failure.
                raise RequestError(str(exc)) from None
            raise
        return PrefillStream(stream, first, child, watcher)

    async def _open(self, request: dict[str, Any], child: Any) -> tuple[Any, Any]:
        """Send to one live instance; on a refused connection try the next, within a bound.
        Returns the stream and its first item (None if the stream was empty)."""
        deadline = time.monotonic() + self._connect_timeout
        while True:
            for instance_id in self._candidates():
                try:
                    stream = await self._client.direct(
                        request, instance_id, annotated=False, context=child)
                    first = await anext(aiter(stream), None)
                    return stream, first
                except Exception as exc:  # the runtime raises bare Exception for transport errors
                    if not is_connect_error(exc):
                        raise
                    logger.warning("prefill instance %x refused the connection; skipping it",
                                   instance_id)
                    self._dead.add(instance_id)
            if time.monotonic() >= deadline:
                raise ConnectionError("no live prefill worker accepted the request "
                                      f"within {self._connect_timeout:.1f}s")
            # A new instance may be starting; its listener can lag its discovery entry.
            await asyncio.sleep(0.1)

    def _candidates(self) -> list[int]:
        ids = self.live_instances()
        if not ids:
            return []
        self._next = (self._next + 1) % len(ids)
        return ids[self._next:] + ids[:self._next]


class PrefillStream:
    """The prefill worker's items as plain dicts. Closing it before the prefill finished stops
    the prefill request, whether or not it was ever iterated (an unstarted async generator
    would skip its `finally`)."""

    def __init__(self, stream: Any, first: Any, child: Any, watcher: Optional[Any]) -> None:
        self._stream = stream
        self._first = first
        self._child = child
        self._watcher = watcher
        self._closed = False

    def __aiter__(self) -> "PrefillStream":
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._closed:
            raise StopAsyncIteration
        if self._first is not None:
            item, self._first = self._first, None
            return item
        try:
            return await anext(self._stream)
        except StopAsyncIteration:
            self._close(completed=True)
            raise
        except BaseException:
            self._close(completed=False)
            raise

    async def aclose(self) -> None:
        self._close(completed=False)

    def _close(self, completed: bool) -> None:
        if not self._closed:
            self._closed = True
            _unlink(self._watcher, self._child, completed)


def _unlink(watcher: Optional[Any], child: Any, completed: bool) -> None:
    if watcher is not None:
        watcher.cancel()
    if not completed:
        # The decode side gave up (or was cancelled): stop the prefill request too.
        child.stop_generating()


async def _link(parent: Any, child: Any) -> None:
    await parent.async_killed_or_stopped()
    child.stop_generating()


def translate_errors(generate: Handler) -> Handler:
    """Wrap a handler so the frontend shows client errors as HTTP 400 with their message."""

    async def endpoint(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        try:
            async for item in generate(request, context):
                yield item
        except RequestError as exc:
            logger.info("request %s rejected: %s", _request_id(context), exc)
            raise InvalidArgument(str(exc)) from None
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("request %s failed", _request_id(context))
            raise

    return endpoint


def _request_id(context: Any) -> str:
    return context.id() if context is not None else "-"
