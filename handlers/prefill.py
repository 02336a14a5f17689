"""Prefill worker handler (docs/reference/request-life.md, disaggregated step 4).

Starts the engine request with a bootstrap room, then yields the bootstrap info FIRST, then
keeps its stream open until the engine reports the prompt's KV delivered (last item:
PrefillDone) or raises. It never tokenizes: the request carries token ids.

The worker's orchestration style (`PrefillConfig.orchestration`) says which request shape it
serves: decode's `{request, sampling_params}` wrapper (fresh room, bare BootstrapInfo first), or
the frontend's flat preprocessed request (its `bootstrap_info` room, `disaggregated_params`
first; handlers.disagg.frontend_disagg). The health-check canary is decode's shape in both
styles (handlers/core/health.py); any other request of the other style's shape is a 400 naming
the mismatch, not served by a guess.
"""

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Optional

from handlers.core.base import BaseHandler, Context, Engine, RoomEnd, RoomWatch
from handlers.core.errors import EngineError, RequestError
from handlers.core.finish import map_finish_reason
from handlers.disagg.frontend_disagg import first_item, last_item, prefill_leg, request_bootstrap
from handlers.disagg.orchestration import Orchestration, takes_flat_request
from handlers.disagg.prompt_logprobs import PrefillSide, wants_prompt_logprobs
from handlers.core.guard import END, RequestGuard, Stopped, next_item
from handlers.core.health import is_health_check
from handlers.core.live import new_rid
from handlers.core.logprobs import tokens_logprob_kwargs
from handlers.core.routing import routing_kwargs
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, BootstrapInfo
from protocol.disagg import DisaggPreprocessedRequest, PrefillDone
from protocol.limits import MAX_BOOTSTRAP_ROOM
from protocol.validation import ProtocolError, parse

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrefillConfig:
    bootstrap_host: str
    bootstrap_port: int
    # Who sends this worker its legs: the frontend's prefill router or decode workers.
    orchestration: Orchestration
    # Bound on the whole engine request (queueing, forward pass, KV transfer); the engine
    # bounds the transfer itself too, this catches an engine that never ends the stream.
    engine_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.orchestration.disaggregated:
            raise ValueError("a prefill worker is disaggregated: orchestration must be "
                             "frontend or decode")


def new_room() -> int:
    """A fresh room in [1, 2^63): rooms must not collide between concurrent requests."""
    return secrets.randbelow(MAX_BOOTSTRAP_ROOM) + 1


class DecodeEnded(Exception):
    """The decode half of this leg's room ended early (the room watch said so)."""

    def __init__(self, end: RoomEnd) -> None:
        super().__init__(end.message or end.outcome)
        self.end = end


class PrefillHandler(BaseHandler):
    def __init__(self, engine: Engine, config: PrefillConfig,
                 rooms: Optional[RoomWatch] = None) -> None:
        super().__init__(engine)
        self.config = config
        self.rooms = rooms  # frontend-orchestrated: the decode halves' room watch

    async def generate(
        self, request: dict[str, Any], context: Optional[Context] = None
    ) -> AsyncIterator[dict[str, Any]]:
        health_check = is_health_check(request)
        from_frontend = not health_check and takes_flat_request(self.config.orchestration,
                                                                request)
        ids, params, sent, logprobs = self._leg(request, from_frontend)
        if wants_prompt_logprobs(logprobs) and self.rooms is None and not health_check:
            raise RequestError(
                "output_options.prompt_logprobs (completions' echo, or prompt_logprobs): this "
                "prefill process has no room watch to send prompt logprobs to the decode worker "
                "on (an attached --tokenizer-worker-num process); use an aggregated model")
        boot = sent or BootstrapInfo(bootstrap_host=self.config.bootstrap_host,
                                     bootstrap_port=self.config.bootstrap_port,
                                     bootstrap_room=new_room())
        if health_check:
            boot = boot.model_copy(update={"bootstrap_host": FAKE_BOOTSTRAP_HOST})
        # Watch how the room's decode half ends: the frontend sent it the same room, or (decode-
        # orchestrated) it claims the room this leg draws once it reads it. A room drawn for a
        # frontend leg without bootstrap_info has no decode half to claim it.
        watched = (self.rooms is not None and not health_check
                   and (not from_frontend or sent is not None))
        gone = self.rooms.watch(boot.bootstrap_room) if watched else None
        try:
            # aclosing: closing this stream early must run _serve's cleanup (the abort) now
            async with aclosing(self._serve(ids, params, boot, logprobs, from_frontend,
                                            health_check, gone, context)) as items:
                async for item in items:
                    yield item
        except DecodeEnded as exc:
            if exc.end.outcome == "invalid":  # the client's error: the same 400 from both halves
                raise RequestError(exc.end.message) from None
            logger.info("prefill of room %s stopped: its decode half ended (%s)",
                        boot.bootstrap_room, exc.end.outcome)
        finally:
            if gone is not None:
                self.rooms.unwatch(boot.bootstrap_room, gone)

    async def _serve(self, ids: list[int], params: dict, boot: BootstrapInfo,
                     logprobs: dict[str, Any], from_frontend: bool, health_check: bool,
                     gone: "Optional[asyncio.Future[RoomEnd]]", context: Optional[Context]
                     ) -> AsyncIterator[dict[str, Any]]:
        if gone is not None and gone.done():
            raise DecodeEnded(gone.result())  # before any engine work: nothing to stop
        guard = RequestGuard(self.engine, new_rid(), context, self.live)
        guard.start()
        started = time.monotonic()
        drain: "Optional[asyncio.Task[PrefillDone]]" = None
        # The prompt's forward runs only here: its logprobs go to the decode half directly.
        prompt = (PrefillSide(self.rooms, boot.bootstrap_room)
                  if wants_prompt_logprobs(logprobs) else None)
        try:
            stream = await self.engine.async_generate(
                input_ids=ids,
                sampling_params=params,
                stream=True,
                bootstrap_host=boot.bootstrap_host,
                bootstrap_port=boot.bootstrap_port,
                bootstrap_room=boot.bootstrap_room,
                rid=guard.rid,
                **logprobs,
            )
            guard.engine_started()
            drain = self.spawn(self._drain(stream, guard, prompt), name=f"prefill-{guard.rid}")
            # One loop turn so the drain task submits the request (engines whose stream
            # submits lazily, like SGLang's) before decode learns the room.
            await asyncio.sleep(0)
            if not health_check and not _refused(drain):
                yield first_item(boot) if from_frontend else boot.model_dump()
            done = await self._wait(drain, guard, gone)
        except Stopped:
            logger.info("prefill %s cancelled by the client", guard.rid)
            return
        finally:
            guard.close()
            if drain is not None and not drain.done():
                drain.cancel()  # a cancelled read also aborts a rid SGLang has not registered
        logger.info(
            "prefill %s done: prompt=%d cached=%d in %.3fs",
            guard.rid, done.prompt_tokens, done.cached_tokens, time.monotonic() - started,
        )
        yield last_item(done) if from_frontend else done.model_dump()

    def _leg(self, request: Any, from_frontend: bool
             ) -> tuple[list[int], dict, Optional[BootstrapInfo], dict[str, Any]]:
        """Ids, sampling params, the frontend's room (None: this leg draws one) and the engine
        kwargs (logprobs, routing hints) for either request shape. The
        first token is sampled here: its logprobs, when asked for, go to decode with the KV."""
        if from_frontend:
            ids, params, opts = prefill_leg(request)
            boot = request_bootstrap(request, required=False)
            routing = routing_kwargs(request.get("routing"))
        else:
            try:
                req = parse(DisaggPreprocessedRequest, request)
            except ProtocolError as exc:
                raise RequestError(str(exc)) from None
            ids, boot, opts = req.request.token_ids, None, req.request.output_options
            # The inner request's routing chose the decode's rank: keep its priority only.
            routing = {k: v for k, v in routing_kwargs(req.request.routing).items()
                       if k == "priority"}
            if req.data_parallel_rank is not None:
                routing["routed_dp_rank"] = req.data_parallel_rank
            # n stays: the engine computes the prompt once and gives every choice its first
            # token (docs/reference/orchestration.md, "n > 1").
            params = dict(req.sampling_params)
        return ids, params, boot, {**tokens_logprob_kwargs(opts), **routing}

    async def _wait(self, drain: "asyncio.Task[PrefillDone]", guard: RequestGuard,
                    gone: "Optional[asyncio.Future[RoomEnd]]") -> PrefillDone:
        try:
            # shield: a stop aborts the rid and the drain ends with the engine's stream.
            guard.check()  # before the coroutine exists: race() would leave it unawaited
            done = await guard.race(_first(drain, gone), self.config.engine_timeout_s)
        except TimeoutError:
            raise EngineError(
                f"prefill engine did not finish within {self.config.engine_timeout_s:g} s"
            ) from None
        except ValueError as exc:  # SGLang validates the request on the stream's first read
            raise RequestError(str(exc)) from None
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # we are being cancelled ourselves
            raise EngineError("prefill handler is shutting down") from None
        if isinstance(done, PrefillDone):
            return done
        # Abort by rid, and cancel the stream's read too: SGLang ignores an abort of a rid its
        # TokenizerManager has not registered yet, but a cancelled first read aborts it.
        guard.abort(f"its decode half ended ({done.outcome})")
        raise DecodeEnded(done)

    async def _drain(
        self, stream: AsyncIterator[dict[str, Any]], guard: RequestGuard,
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


async def _first(drain: "asyncio.Task[PrefillDone]",
                 gone: "Optional[asyncio.Future[RoomEnd]]") -> "PrefillDone | RoomEnd":
    """The drain's outcome, or the decode half's end if that comes first."""
    if gone is None:
        return await asyncio.shield(drain)
    await asyncio.wait({drain, gone}, return_when=asyncio.FIRST_COMPLETED)
    return drain.result() if drain.done() else gone.result()


def _refused(drain: "asyncio.Task[PrefillDone]") -> bool:
    """SGLang validates a request on the stream's first read (ValueError): then no decode
    must be sent to a room that will never be served."""
    return drain.done() and not drain.cancelled() and isinstance(drain.exception(), ValueError)
