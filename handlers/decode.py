"""Decode (or aggregated) worker handler: the endpoint the frontend calls
(docs/reference/request-life.md).

Validate -> sampling params -> input ids (Tokens: as sent; Text: template + tokenize once, off
the loop) -> [disaggregated: ask prefill for a bootstrap room, bounded (`prefill_handoff.py`); or,
frontend-orchestrated, take the room the frontend sent in `bootstrap_info`] -> own engine request
with its own rid -> stream token deltas or chat chunks. A client stop aborts the engine request
by rid at any point, also before the first token; a failed prefill aborts it and errors.
"""

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from handlers.core.base import (
    BaseHandler, Context, Engine, KVPaths, PrefillClient, RoomClaims,
)
from handlers.text.chat_outputs import ChoiceOutputs
from handlers.text.chat_stream import ChatStream, asks_for
from handlers.core.errors import EngineError, RequestError
from handlers.disagg.frontend_disagg import SentRoom
from handlers.disagg.half_end import HalfEnd, claim_boot
from handlers.disagg.leg_end import PrefillLegEnd
from handlers.core.guard import END, RequestGuard, Stopped, aclose, next_item
from handlers.core.live import new_rid
from handlers.core.outcome import Outcome, outcome_of
from handlers.core.logprobs import (
    ChatLogprobs, prefill_request_options, text_logprob_kwargs, tokens_logprob_kwargs,
)
from handlers.disagg.orchestration import Orchestration
from handlers.disagg.prefill_handoff import PrefillHandoff
from handlers.disagg.prompt_logprobs import DecodeSide, decode_logprob_kwargs
from handlers.core.routing import routing_kwargs
from handlers.text.preprocess import Preprocessor
from handlers.core.sampling import text_sampling_params, tokens_sampling_params
from handlers.text.template_kwargs import check_template_kwargs
from handlers.core.token_stream import TokenStream
from handlers.text.tool_calls import ChatParsers, add_constraint, plan_output
from handlers.core.unsupported import check_text_request, check_tokens_request
from protocol.bootstrap import BootstrapInfo
from protocol.chat import ChatCompletionRequest
from protocol.preprocessed import PreprocessedRequest
from protocol.validation import ModelT, ProtocolError, parse

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


@dataclass
class _Job:
    input_ids: list[int]
    sampling_params: dict[str, Any]
    prefill_request: PreprocessedRequest
    stream: Union[TokenStream, ChatStream]
    boot: Optional[BootstrapInfo] = None  # the frontend's, when it orchestrates
    # the engine's return_logprob, top_logprobs_num, ... and the routing hints
    # (handlers/core/routing.py)
    logprob_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_from_prefill: bool = False  # disaggregated prompt logprobs (prompt_logprobs.py)


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
        self.preprocessor = preprocessor
        self.parsers = parsers  # Text mode: SGLang's tool-call / reasoning parsers, if set
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
        self._chat_logprobs = ChatLogprobs(lambda: preprocessor.tokenizer)

    async def generate(
        self, request: dict[str, Any], context: Optional[Context] = None
    ) -> AsyncIterator[dict[str, Any]]:
        started = time.monotonic()
        sent = SentRoom(request) if self._sent_rooms else None
        end = HalfEnd(await claim_boot(self.rooms, sent.boot if sent is not None else None))
        try:
            job = await self._prepare(request, context, sent)
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

    # --- preparing: validation, ids, sampling params --------------------------------------

    async def _prepare(self, request: dict[str, Any], context: Optional[Context],
                       sent: Optional[SentRoom]) -> _Job:
        if self.config.skip_tokenizer_init:
            job = self._prepare_tokens(request)
        else:
            job = await self._prepare_text(request, context)
        if sent is not None:
            job.boot = sent.required()
        return job

    def _prepare_tokens(self, request: dict[str, Any]) -> _Job:
        req = _parse(PreprocessedRequest, request)
        check_tokens_request(req)
        self._check_prompt(req.token_ids, vocab_field="token_ids")
        params = tokens_sampling_params(
            req,
            prompt_len=len(req.token_ids),
            context_length=self.config.context_length,
            skip_tokenizer_init=True,
        )
        logprobs, from_prefill = decode_logprob_kwargs(tokens_logprob_kwargs(req.output_options),
                                                       self.config.orchestration.disaggregated)
        return _Job(req.token_ids, params, req, TokenStream(req.output_options),
                    logprob_kwargs={**logprobs,
                                    **routing_kwargs(req.routing,
                                                     self.config.orchestration.disaggregated)},
                    prompt_from_prefill=from_prefill)

    async def _prepare_text(self, request: dict[str, Any], context: Optional[Context]) -> _Job:
        req = _parse(ChatCompletionRequest, request)
        check_text_request(req)
        logprobs = text_logprob_kwargs(req)
        kwargs = req.template_kwargs()
        if kwargs:
            check_template_kwargs(kwargs, req.template_kwargs_field)
        plan = plan_output(req, self.parsers, kwargs)
        ids = req.prompt_token_ids
        if ids is None:
            ids = await self.preprocessor.chat_token_ids(req.template_messages(), kwargs,
                                                         plan.template_tools)
        # Our own tokenizer's ids need no vocabulary check; the client's do.
        self._check_prompt(ids, vocab_field="nvext.token_data" if req.prompt_token_ids else None)
        params = text_sampling_params(
            req, prompt_len=len(ids), context_length=self.config.context_length
        )
        add_constraint(params, plan.constraint)
        chunk_id = f"chatcmpl-{context.id() if context is not None else uuid.uuid4().hex}"
        stream = ChatStream(chunk_id, req.model or self.config.served_model_name, req.wants_usage,
                            req.wants_continuous_usage,
                            self._chat_logprobs if logprobs else None,
                            ChoiceOutputs(plan.new_parse, req.stream) if plan.new_parse else None,
                            stop_reason=asks_for(req, "stop_reason"))
        # model_construct: the ids come from our own tokenizer, no need to validate them again.
        prefill = PreprocessedRequest.model_construct(
            token_ids=ids, output_options=prefill_request_options(logprobs))
        return _Job(ids, params, prefill, stream, logprob_kwargs=logprobs)

    def _check_prompt(self, ids: list[int], vocab_field: Optional[str]) -> None:
        limit = self.config.context_length
        if len(ids) >= limit:
            raise RequestError(
                f"prompt is too long: {len(ids)} tokens, the model's context length is {limit} "
                f"tokens (the prompt must leave room for at least one generated token)"
            )
        if vocab_field is not None and ids:
            top = max(ids)
            if top >= self.config.vocab_size:
                raise RequestError(
                    f"{vocab_field}[{ids.index(top)}]: token id {top} is out of vocabulary "
                    f"(vocab size {self.config.vocab_size})"
                )

    # --- running: engine stream, prefill hand-off ----------------------------------------

    async def _run(
        self, job: _Job, guard: RequestGuard, context: Optional[Context], end: HalfEnd
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


def _parse(model: type[ModelT], request: Any) -> ModelT:
    try:
        return parse(model, request)
    except ProtocolError as exc:
        raise RequestError(str(exc)) from None
