"""The surfaces handlers depend on (typing.Protocols owned here, implemented elsewhere) and a
small BaseHandler that tracks background tasks so cleanup() can cancel them."""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any, Optional, Protocol

from handlers.core.live import LiveRequests
from protocol.bootstrap import BootstrapInfo
from protocol.room_watch import PromptLogprobs

logger = logging.getLogger(__name__)


class TokenizerManager(Protocol):
    """SGLang's `engine.tokenizer_manager` subset. `tokenizer` is None with skip_tokenizer_init."""

    tokenizer: Any

    def abort_request(self, rid: str) -> None: ...


class Engine(Protocol):
    """SGLang's offline Engine API subset (docs/reference/engine-api.md); with
    stream=True the awaited value is an async iterator of incremental chunks
    {"text"?, "output_ids", "meta_info"}."""

    tokenizer_manager: TokenizerManager

    async def async_generate(
        self,
        prompt: Any = None,
        sampling_params: Optional[dict[str, Any]] = None,
        input_ids: Optional[list[int]] = None,
        stream: bool = False,
        bootstrap_host: Optional[str] = None,
        bootstrap_port: Optional[int] = None,
        bootstrap_room: Optional[int] = None,
        rid: Optional[str] = None,
    ) -> AsyncIterator[dict[str, Any]]: ...


class Context(Protocol):
    """Dynamo's per-request Context subset."""

    def id(self) -> str: ...

    def is_stopped(self) -> bool: ...

    def async_killed_or_stopped(self) -> Awaitable[Any]: ...


class PrefillClient(Protocol):
    """Sends a DisaggPreprocessedRequest dict to a prefill worker. The component adapts
    Dynamo's Client: it links a child of `context` (cancelling the client cancels the
    prefill) and yields plain dicts. Closing the returned iterator (aclose) must stop the
    child context, so a decode that gives up also stops the prefill."""

    async def generate(
        self, request: dict[str, Any], context: Optional[Context]
    ) -> AsyncIterator[dict[str, Any]]: ...


class KVPaths(Protocol):
    """The decode's KV path probe (components/worker/rooms/kv_probe.py): `check` gives None
    once the KV path to the room's prefill has moved a real transfer, else the probe to await;
    either raises EngineUnavailable (a 503 saying why) while the path is broken."""

    def check(self, boot: BootstrapInfo) -> "Optional[asyncio.Future[None]]": ...


class RoomEnd(Protocol):
    """How the decode half of a room ended (protocol.room_watch.Release)."""

    room: int
    outcome: str  # "cancelled", "failed" or "invalid" (the client's error, `message` says it)
    message: str


class RoomWatch(Protocol):
    """Prefill side of the room watch (components/worker/rooms/watch.py): `watch(room)` resolves with
    the RoomEnd as soon as the room's decode half ends early (at once if it already has)."""

    def watch(self, room: int) -> "asyncio.Future[RoomEnd]": ...

    def unwatch(self, room: int, gone: "asyncio.Future[RoomEnd]") -> None: ...

    def deliver(self, msg: PromptLogprobs) -> None:
        """Send the room's prompt logprobs to the decode half that claimed it."""

    def leg_ended(self, room: int) -> None:
        """Tell the decode half that claimed the room that this prefill leg has ended."""


class RoomClaim(Protocol):
    def release(self, outcome: str, message: str = "") -> None: ...

    def prompt_logprobs(self) -> "asyncio.Future[PromptLogprobs]":
        """The prefill's prompt logprobs of the room (`error` set: none will come)."""

    def leg_ended(self) -> "asyncio.Future[bool]":
        """True once the room's prefill leg has ended; False: no word will come."""


class RoomClaims(Protocol):
    """Decode side of the room watch (components/worker/rooms/claims.py): claim the room of a decode
    half as it arrives; None when the prefill's watch cannot be reached."""

    async def claim(self, host: str, port: int, room: int) -> Optional[RoomClaim]: ...


class BaseHandler:
    """generate(request, context) is the endpoint; cleanup() cancels tracked tasks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.live = LiveRequests()  # its engine requests in flight (a stopping worker ends them)
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start a background task that cleanup() will cancel (never an untracked task)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    @property
    def running_tasks(self) -> int:
        """Tasks started with spawn() that have not ended yet (cleanup() cancels them)."""
        return len(self._tasks)

    def _reap(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        # Retrieve the outcome so a task nobody awaited any more never logs "exception was
        # never retrieved"; its waiter (if any) has already seen it.
        if not task.cancelled() and task.exception() is not None:
            logger.debug("task %s ended with %r", task.get_name(), task.exception())

    def generate(
        self, request: dict[str, Any], context: Optional[Context] = None
    ) -> AsyncIterator[dict[str, Any]]:
        raise NotImplementedError

    async def cleanup(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        logger.debug("handler cleanup cancelled %d task(s)", len(tasks))
