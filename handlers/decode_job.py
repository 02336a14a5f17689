"""A decode request turned into what the engine runs (`Job`): parsed and validated (a 400
naming the problem), its input ids (Tokens: as sent; Text: the chat template rendered and
tokenized once, off the loop), sampling params, logprob and routing options, and the stream that
converts the engine's output for the client (handlers/decode.py runs it)."""

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from handlers.core.base import Context
from handlers.core.errors import RequestError
from handlers.core.logprobs import (
    ChatLogprobs, prefill_request_options, text_logprob_kwargs, tokens_logprob_kwargs,
)
from handlers.core.routing import routing_kwargs
from handlers.core.sampling import text_sampling_params, tokens_sampling_params
from handlers.core.token_stream import TokenStream
from handlers.core.unsupported import check_text_request, check_tokens_request
from handlers.disagg.frontend_disagg import SentRoom
from handlers.disagg.prompt_logprobs import decode_logprob_kwargs
from handlers.text.chat_outputs import ChoiceOutputs
from handlers.text.chat_stream import ChatStream, asks_for
from handlers.text.preprocess import Preprocessor
from handlers.text.template_kwargs import check_template_kwargs
from handlers.text.tool_calls import ChatParsers, add_constraint, plan_output
from protocol.bootstrap import BootstrapInfo
from protocol.chat import ChatCompletionRequest
from protocol.preprocessed import PreprocessedRequest
from protocol.validation import ModelT, ProtocolError, parse

if TYPE_CHECKING:
    from handlers.decode import DecodeConfig


@dataclass
class Job:
    input_ids: list[int]
    sampling_params: dict[str, Any]
    prefill_request: PreprocessedRequest
    stream: Union[TokenStream, ChatStream]
    boot: Optional[BootstrapInfo] = None  # the frontend's, when it orchestrates
    # the engine's return_logprob, top_logprobs_num, ... and the routing hints
    # (handlers/core/routing.py)
    logprob_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_from_prefill: bool = False  # disaggregated prompt logprobs (prompt_logprobs.py)


class JobPreparer:
    def __init__(self, config: "DecodeConfig", preprocessor: Optional[Preprocessor],
                 parsers: Optional[ChatParsers]) -> None:
        self.config = config
        self.preprocessor = preprocessor
        self.parsers = parsers  # Text mode: SGLang's tool-call / reasoning parsers, if set
        self.chat_logprobs = ChatLogprobs(lambda: preprocessor.tokenizer)

    async def prepare(self, request: dict[str, Any], context: Optional[Context],
                      sent: Optional[SentRoom]) -> Job:
        if self.config.skip_tokenizer_init:
            job = self._prepare_tokens(request)
        else:
            job = await self._prepare_text(request, context)
        if sent is not None:
            job.boot = sent.required()
        return job

    def _prepare_tokens(self, request: dict[str, Any]) -> Job:
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
        return Job(req.token_ids, params, req, TokenStream(req.output_options),
                    logprob_kwargs={**logprobs,
                                    **routing_kwargs(req.routing,
                                                     self.config.orchestration.disaggregated)},
                    prompt_from_prefill=from_prefill)

    async def _prepare_text(self, request: dict[str, Any], context: Optional[Context]) -> Job:
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
                            self.chat_logprobs if logprobs else None,
                            ChoiceOutputs(plan.new_parse, req.stream) if plan.new_parse else None,
                            stop_reason=asks_for(req, "stop_reason"))
        # model_construct: the ids come from our own tokenizer, no need to validate them again.
        prefill = PreprocessedRequest.model_construct(
            token_ids=ids, output_options=prefill_request_options(logprobs))
        return Job(ids, params, prefill, stream, logprob_kwargs=logprobs)

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


def _parse(model: type[ModelT], request: Any) -> ModelT:
    try:
        return parse(model, request)
    except ProtocolError as exc:
        raise RequestError(str(exc)) from None
