"""Prefill worker handler (docs/reference/request-life.md, disaggregated step 4).

Starts the engine request with a bootstrap room, then yields the bootstrap info FIRST, then
keeps its stream open until the engine reports the prompt's KV delivered (last item:
PrefillDone) or raises; an `n > 1` frontend leg ends right after its first item and a task sees
its engine request through (handlers/disagg/leg_end.py). It never tokenizes: the request
carries token ids.

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
from handlers.disagg.frontend_disagg import first_item, last_item, prefill_leg
from handlers.disagg.orchestration import Orchestration, takes_flat_request
from handlers.disagg.prefill_engine import PrefillLeg, drain_engine, refused
from handlers.disagg.prompt_logprobs import PrefillSide, wants_prompt_logprobs
from handlers.core.guard import RequestGuard, Stopped
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
        leg = PrefillLeg(self.rooms.watch(boot.bootstrap_room) if watched else None,
                         early=from_frontend and not health_check
                         and int(params.get("n") or 1) > 1)
        gone = leg.gone
        try:
            # aclosing: closing this stream early must run _serve's cleanup (the abort) now
            async with aclosing(self._serve(ids, params, boot, logprobs, from_frontend,
                                            health_check, leg, context)) as items:
                async for item in items:
                    yield item
            if gone is not None and leg.early and (not leg.detached or leg.through("stream")):
                self.rooms.leg_ended(boot.bootstrap_room)  # its engine request is through too
        except DecodeEnded as exc:
            if exc.end.outcome == "invalid":  # the client's error: the same 400 from both halves
                raise RequestError(exc.end.message) from None
            logger.info("prefill of room %s stopped: its decode half ended (%s)",
                        boot.bootstrap_room, exc.end.outcome)
        finally:
            if gone is not None and not leg.detached:
                self.rooms.unwatch(boot.bootstrap_room, gone)

    async def _serve(self, ids: list[int], params: dict, boot: BootstrapInfo,
                     logprobs: dict[str, Any], from_frontend: bool, health_check: bool,
                     leg: PrefillLeg, context: Optional[Context]
                     ) -> AsyncIterator[dict[str, Any]]:
        gone = leg.gone
        if gone is not None and gone.done():
            raise DecodeEnded(gone.result())  # before any engine work: nothing to stop
        # An early-ending leg's engine request outlives the leg's stream and context (the
        # 1.6.1 frontend never stops a prefill leg anyway): the room watch stops it.
        guard = RequestGuard(self.engine, new_rid(), None if leg.early else context, self.live)
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
            drain = self.spawn(drain_engine(stream, guard, prompt), name=f"prefill-{guard.rid}")
            # One loop turn so the drain task submits the request (engines whose stream
            # submits lazily, like SGLang's) before decode learns the room.
            await asyncio.sleep(0)
            if not health_check and not refused(drain):
                yield first_item(boot) if from_frontend else boot.model_dump()
            if leg.early and not drain.done():
                # n > 1: end the leg now, long before the decode's first finish can come
                # (handlers/disagg/leg_end.py); a task sees the engine request through.
                leg.detached = True
                self.spawn(self._see_through(drain, guard, leg, boot.bootstrap_room),
                           name=f"prefill-leg-{guard.rid}")
                yield last_item(PrefillDone(prompt_tokens=len(ids), cached_tokens=0))
                return
            done = await self._wait(drain, guard, gone)
        except Stopped:
            logger.info("prefill %s cancelled by the client", guard.rid)
            return
        finally:
            if not leg.detached:
                guard.close()
                if drain is not None and not drain.done():
                    drain.cancel()  # a cancelled read aborts a rid SGLang has not registered
        logger.info(
            "prefill %s done: prompt=%d cached=%d in %.3fs",
            guard.rid, done.prompt_tokens, done.cached_tokens, time.monotonic() - started,
        )
        yield last_item(done) if from_frontend else done.model_dump()

    async def _see_through(self, drain: "asyncio.Task[PrefillDone]", guard: RequestGuard,
                           leg: PrefillLeg, room: int) -> None:
        """An early-ended leg's engine request, waited for as its leg would have: aborted if
        the room's decode half ends, bounded by the engine timeout; then the room unwatched."""
        try:
            done = await self._wait(drain, guard, leg.gone)
            logger.info("prefill %s done after its leg: prompt=%d cached=%d", guard.rid,
                        done.prompt_tokens, done.cached_tokens)
        except DecodeEnded as exc:
            logger.info("prefill of room %s stopped: its decode half ended (%s)", room,
                        exc.end.outcome)
        except (EngineError, RequestError, Stopped) as exc:
            logger.warning("prefill %s failed after its leg ended: %s", guard.rid, exc)
        finally:
            guard.close()
            if not drain.done():
                drain.cancel()
            if leg.gone is not None:
                if not leg.gone.done() and leg.through("engine"):
                    self.rooms.leg_ended(room)  # its stream had ended already
                self.rooms.unwatch(room, leg.gone)

    def _leg(self, request: Any, from_frontend: bool
             ) -> tuple[list[int], dict, Optional[BootstrapInfo], dict[str, Any]]:
        """Ids, sampling params, the frontend's room (None: this leg draws one) and the engine
        kwargs (logprobs, routing hints) for either request shape. The
        first token is sampled here: its logprobs, when asked for, go to decode with the KV."""
        if from_frontend:
            ids, params, opts, boot = prefill_leg(request)
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
            # The drain is left running: a stop aborts the rid and it ends with the stream.
            await guard.first_done({drain} if gone is None else {drain, gone},
                                   self.config.engine_timeout_s)
            done = drain.result() if drain.done() else gone.result()
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
