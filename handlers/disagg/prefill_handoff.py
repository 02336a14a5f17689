"""Decode-orchestrated disaggregation, decode's side (docs/reference/request-life.md,
"Disaggregated (decode-orchestrated)", steps 3-5): send the ids + sampling params to a prefill
worker, wait (bounded) for its bootstrap room, then drain the rest of its stream in a tracked
task, so a prefill that fails before decode has its KV aborts decode's engine request instead
of leaving it waiting for KV that never comes."""

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Optional

from handlers.core.base import Context, PrefillClient
from handlers.core.errors import HandlerError, PrefillError, PrefillUnavailable, RequestError
from handlers.core.guard import END, RequestGuard, Stopped, aclose, next_item
from protocol.bootstrap import BootstrapInfo
from protocol.preprocessed import PreprocessedRequest
from protocol.validation import ProtocolError, parse

# The handler's BaseHandler.spawn: its cleanup() cancels the watchers started here.
Spawn = Callable[[Coroutine[Any, Any, Any], str], "asyncio.Task[Any]"]


class PrefillHandoff:
    def __init__(self, client: PrefillClient, spawn: Spawn, bootstrap_timeout_s: float,
                 prefill_timeout_s: float) -> None:
        self._client = client
        self._spawn = spawn
        self._bootstrap_timeout_s = bootstrap_timeout_s  # prefill's first item (the room)
        self._prefill_timeout_s = prefill_timeout_s  # the prefill stream's whole life

    async def start(
        self, prefill_request: PreprocessedRequest, sampling_params: dict[str, Any],
        guard: RequestGuard, context: Optional[Context],
    ) -> BootstrapInfo:
        """Send the ids + params to a prefill worker and wait (bounded) for its room."""
        wire = {"request": prefill_request.wire_dict(), "sampling_params": sampling_params}
        timeout = self._bootstrap_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        items = None
        try:
            items = await guard.race(self._client.generate(wire, context), timeout)
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            boot = _bootstrap_from(await guard.race(next_item(items), remaining))
        except BaseException as exc:
            if items is not None:
                self._spawn(aclose(items), f"prefill-close-{guard.rid}")
            if isinstance(exc, TimeoutError):
                raise PrefillUnavailable(f"prefill worker did not respond within {timeout:g} s")
            if isinstance(exc, (Stopped, HandlerError)) or not isinstance(exc, Exception):
                raise
            # The runtime client raises its own exception types (no Dynamo import here).
            raise PrefillError(f"prefill worker failed: {exc}") from exc
        self._spawn(self._watch(items, guard), f"prefill-watch-{guard.rid}")
        return boot

    async def _watch(self, items: AsyncIterator[dict], guard: RequestGuard) -> None:
        """Drain the rest of the prefill stream; if it fails before decode got its first
        token, abort decode's engine request rather than wait for KV that never comes."""
        try:
            async with asyncio.timeout(self._prefill_timeout_s):
                while (item := await next_item(items)) is not END:
                    if "error" in item:
                        raise PrefillError(f"prefill worker failed: {item['error']}")
                    if item.get("finished"):
                        return
            raise PrefillError("prefill stream ended before its engine finished")
        except TimeoutError:
            guard.fail(PrefillError(f"prefill took over {self._prefill_timeout_s:g} s"))
        except (PrefillError, RequestError) as exc:  # RequestError: the prefill refused it
            guard.fail(exc)
        except Exception as exc:  # the runtime client's own exception types
            guard.fail(PrefillError(f"prefill worker failed: {exc}"))
        finally:
            await aclose(items)


def _bootstrap_from(item: Any) -> BootstrapInfo:
    if item is END:
        raise PrefillError("prefill stream ended before sending bootstrap info")
    if isinstance(item, dict) and "error" in item:
        raise PrefillError(f"prefill worker failed: {item['error']}")
    try:
        return parse(BootstrapInfo, item)
    except ProtocolError as exc:
        raise PrefillError(f"prefill sent bad bootstrap info: {exc}") from None
