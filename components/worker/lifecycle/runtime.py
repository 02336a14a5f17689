"""Where the handlers meet Dynamo's runtime.

- `RuntimePrefillClient` adapts Dynamo's `Client` to the handlers' `PrefillClient` protocol:
  plain-dict streams, a child context linked to the request's, and a retry over instances that
  refuse connections (a killed prefill stays listed in file discovery until its entry is
  removed; a refusing instance is skipped for a bounded, growing backoff, then tried again).
  What the prefill worker rejected as the client's error (`InvalidArgument`, or a `ValueError`,
  which the runtime re-raises with an "InvalidRequest: ValueError: " prefix) becomes the
  handlers' `RequestError`, so disaggregated mode answers 400 with the same message as
  aggregated mode. (The other way, a handler's errors to the frontend's statuses, is
  components/worker/lifecycle/endpoint.py.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from dynamo.llm.exceptions import InvalidArgument
from dynamo.runtime import Context

from components.worker.lifecycle.backoff import Backoff
from handlers.core.errors import PrefillUnavailable, RequestError

logger = logging.getLogger(__name__)

# The runtime reports a refused connection as a plain Exception with this prefix (1.6.1).
_CONNECT_FAILED = "Unavailable: TCP connection"


_VALUE_ERROR_PREFIX = "InvalidRequest: ValueError: "


# ... and a request the peer never answered (a hung process) with this one.
_DEADLINE = "DeadlineExceeded"


def is_connect_error(exc: BaseException) -> bool:
    return str(exc).startswith(_CONNECT_FAILED)


def remote_error(exc: BaseException, since: float) -> BaseException:
    """The handlers' view of an exception the prefill worker's stream raised; `since` is when
    the request (or the wait for its next item) began."""
    if str(exc).startswith(_DEADLINE):
        waited = time.monotonic() - since
        return PrefillUnavailable(f"prefill worker did not respond within {waited:.0f} s")
    if isinstance(exc, InvalidArgument):
        return RequestError(str(exc))
    if isinstance(exc, ValueError) and str(exc).startswith(_VALUE_ERROR_PREFIX):
        return RequestError(str(exc)[len(_VALUE_ERROR_PREFIX):])
    return exc


class RuntimePrefillClient:
    """`await generate(request, context)` -> async iterator of the prefill worker's dicts."""

    def __init__(self, client: Any, connect_timeout: float = 5.0,
                 backoff: Optional[Backoff] = None) -> None:
        self._client = client
        self._connect_timeout = connect_timeout
        # Instances that refused a connection, skipped until their backoff ends. A new
        # instance id is a new key; a restarted decode starts empty.
        self._refused = backoff if backoff is not None else Backoff()
        self._next = 0

    def live_instances(self) -> list[int]:
        ids = list(self._client.instance_ids())
        self._refused.forget_all_but(ids)
        return [i for i in ids if not self._refused.waiting(i)]

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
        except BaseException:
            _unlink(watcher, child, completed=False)
            raise
        return PrefillStream(stream, first, child, watcher)

    async def _open(self, request: dict[str, Any], child: Any) -> tuple[Any, Any]:
        """Send to one live instance; on a refused connection try the next, within a bound.
        Returns the stream and its first item (None if the stream was empty)."""
        deadline = time.monotonic() + self._connect_timeout
        while True:
            for instance_id in self._candidates():
                sent = time.monotonic()
                try:
                    stream = await self._client.direct(
                        request, instance_id, annotated=False, context=child)
                    first = await anext(aiter(stream), None)
                except Exception as exc:  # the runtime raises bare Exception for transport errors
                    if not is_connect_error(exc):
                        raise remote_error(exc, sent) from exc
                    delay = self._refused.failed(instance_id)
                    logger.warning("prefill instance %x refused the connection; retrying it "
                                   "in %.1fs at the earliest", instance_id, delay)
                    continue
                self._refused.succeeded(instance_id)
                return stream, first
            if time.monotonic() >= deadline:
                raise PrefillUnavailable("prefill worker did not respond within "
                                         f"{self._connect_timeout:g} s (no instance accepted "
                                         "the connection)")
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
        waiting_since = time.monotonic()
        try:
            return await anext(self._stream)
        except StopAsyncIteration:
            self._close(completed=True)
            raise
        except Exception as exc:
            self._close(completed=False)
            raise remote_error(exc, waiting_since) from exc
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
