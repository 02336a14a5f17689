"""Decode (or aggregated) worker handler: the endpoint the frontend calls
(docs/reference/request-life.md).

Validate -> sampling params -> input ids (Tokens: as sent; Text: template + tokenize once, off
the loop; `decode_job.py`) -> [disaggregated: ask prefill for a bootstrap room, bounded
(`prefill_handoff.py`); or, frontend-orchestrated, take the room the frontend sent in
`bootstrap_info`] -> own engine request
with its own rid -> stream token deltas or chat chunks. A client stop aborts the engine request
by rid at any point, also before the first token; a failed prefill aborts it and errors.
"""

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Optional

from handlers.core.base import (
    BaseHandler, Context, Engine, KVPaths, PrefillClient, RoomClaims,
)
from handlers.core.errors import EngineError, RequestError
from handlers.core.guard import END, RequestGuard, Stopped, aclose, next_item
from handlers.core.live import new_rid
from handlers.core.outcome import Outcome, outcome_of
from handlers.decode_job import Job, JobPreparer
from handlers.disagg.frontend_disagg import SentRoom
from handlers.disagg.half_end import HalfEnd, claim_boot
from handlers.disagg.leg_end import PrefillLegEnd
from handlers.disagg.orchestration import Orchestration
from handlers.disagg.prefill_handoff import PrefillHandoff
from handlers.disagg.prompt_logprobs import DecodeSide
from handlers.text.preprocess import Preprocessor
from handlers.text.tool_calls import ChatParsers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeConfig:
    served_model_name: str
    context_length: int
    vocab_size: int
    # Where each request's room comes from: none (aggregated), the frontend's prefill router
    # (the request carries bootstrap_info) or this handler's own call to a prefill worker.
    # No default: the worker's role decides it (components/worker/role.py).
    orchestration: Orchestration
    skip_tokenizer_init: bool = True  # True: Tokens mode; False: Text mode
    bootstrap_timeout_s: float = 30.0  # prefill's first item (the bootstrap room)
    first_token_timeout_s: float = 300.0  # queueing + prefill + KV transfer
    prefill_timeout_s: float = 600.0  # the prefill stream's whole life


class DecodeHandler(BaseHandler):
    def __init__(
        self,
        engine: Engine,
        config: DecodeConfig,
        prefill_client: Optional[PrefillClient] = None,
        preprocessor: Optional[Preprocessor] = None,
        rooms: Optional[RoomClaims] = None,
        parsers: Optional[ChatParsers] = None,
        kv_paths: Optional[KVPaths] = None,
    ) -> None:
        super().__init__(engine)
        calls_prefill = config.orchestration is Orchestration.DECODE
        if calls_prefill and prefill_client is None:
            raise ValueError("decode-orchestrated decode needs a prefill client")
        if not config.skip_tokenizer_init and preprocessor is None:
            raise ValueError("Text mode (no skip_tokenizer_init) needs a preprocessor")
        self.config = config
        self.prefill_client = prefill_client
        self._jobs = JobPreparer(config, preprocessor, parsers)
        # Claims each request's room at its prefill, so the prefill stops as soon as this half
        # ends early (docs/reference/room-watch.md): as the request arrives when the
        # frontend orchestrates, once the prefill names the room when decode does.
        self.rooms = rooms if config.orchestration.disaggregated else None
        self.kv_paths = kv_paths if config.orchestration.disaggregated else None
        # The room source, picked once: the request's bootstrap_info, this handoff, or none.
        self._sent_rooms = config.orchestration is Orchestration.FRONTEND
        self._handoff: Optional[PrefillHandoff] = None
        if calls_prefill:
            self._handoff = PrefillHandoff(prefill_client, self.spawn,
                                           config.bootstrap_timeout_s, config.prefill_timeout_s)

    async def generate(
        self, request: dict[str, Any], context: Optional[Context] = None
    ) -> AsyncIterator[dict[str, Any]]:
        started = time.monotonic()
        sent = SentRoom(request) if self._sent_rooms else None
        end = HalfEnd(await claim_boot(self.rooms, sent.boot if sent is not None else None))
        try:
            job = await self._jobs.prepare(request, context, sent)
            guard = RequestGuard(self.engine, new_rid(), context, self.live)
            guard.start()
            try:
                async for out in self._run(job, guard, context, end):
                    yield out
            except Stopped as exc:
                logger.info("request %s cancelled by the client", guard.rid)
                end.outcome = outcome_of(exc)
                return
            finally:
                guard.close()
                await aclose(guard.stream)  # SGLang aborts every sub-request (n > 1) it started
            end.outcome = Outcome.SUCCESS
        except BaseException as exc:
            end.outcome = outcome_of(exc)
            if end.outcome is Outcome.INVALID:  # the prefill's half answers the same 400
                end.message = str(exc)
            raise
        finally:
            end.release()
        logger.info(
            "request %s done: prompt=%d completion=%d in %.3fs",
            guard.rid, len(job.input_ids), job.stream.completion_tokens,
            time.monotonic() - started,
        )

    # --- running: engine stream, prefill hand-off ----------------------------------------

    async def _run(
        self, job: Job, guard: RequestGuard, context: Optional[Context], end: HalfEnd
    ) -> AsyncIterator[dict[str, Any]]:
        boot = job.boot
        if self._handoff is not None:
            boot = await self._handoff.start(job.prefill_request, job.sampling_params, guard,
                                             context)
            end.claim = await claim_boot(self.rooms, boot)
        prompt = DecodeSide(end.claim) if job.prompt_from_prefill else None
        leg = (PrefillLegEnd(end.claim, boot.bootstrap_room)
               if self._sent_rooms and int(job.sampling_params.get("n") or 1) > 1 else None)
        probing = self.kv_paths.check(boot) if boot is not None and self.kv_paths else None
        if probing is not None:  # the first room for a prefill waits for its path's probe
            await guard.race(probing, self.config.first_token_timeout_s)
        guard.check()
        stream = guard.stream = await self.engine.async_generate(
            input_ids=job.input_ids,
            sampling_params=job.sampling_params,
            stream=True,
            rid=guard.rid,
            **job.logprob_kwargs,
            **(boot.model_dump() if boot is not None else {}),
        )
        guard.engine_started()
        try:
            chunk = await guard.race(next_item(stream), self.config.first_token_timeout_s)
        except TimeoutError:
            raise EngineError(
                f"no first token within {self.config.first_token_timeout_s:g} s"
            ) from None
        except ValueError as exc:  # SGLang validates the request on the stream's first read
            raise RequestError(str(exc)) from None
        guard.progressing()  # decode has the KV now: a later prefill hiccup is harmless
        while chunk is not END:
            guard.check()
            if leg is not None:  # n > 1: no finish before the prefill leg ended (leg_end.py)
                await leg.before(chunk, guard)
            if prompt is not None:  # the prefill's prompt logprobs into each final chunk
                chunk = await prompt.merge(chunk, guard)
            out = job.stream.convert(chunk)
            if out is not None:
                yield out
            chunk = await next_item(stream)
        guard.finish()
        tail = job.stream.close()
        if tail is not None:
            yield tail
