"""Request -> SGLang `sampling_params` (the names of sglang.srt.sampling.SamplingParams).

Both mappings take the prompt length and the context length so an absent max_tokens becomes
"the rest of the context" (SGLang would default it to 128), and an explicit one that does not fit
is the client's error with SGLang's own message (its TokenizerManager rejects prompt +
max_new_tokens > context_len the same way).
"""

from typing import Any, Optional

from handlers.core.errors import RequestError
from handlers.core.guided import guided_decoding_params, text_guided_params
from protocol.chat import ChatCompletionRequest
from protocol.preprocessed import PreprocessedRequest, SamplingOptions


def completion_budget(requested: Optional[int], prompt_len: int, context_length: int) -> int:
    """max_new_tokens: what was asked for, or what the context leaves (>= 1 once the handler
    has checked prompt_len < context_length)."""
    if requested is None:
        return context_length - prompt_len
    if prompt_len + requested > context_length:
        raise RequestError(
            "Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {prompt_len + requested} "
            f"tokens: {prompt_len} tokens from the input messages and {requested} tokens for "
            "the completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.")
    return requested


def _common(opts: Any) -> dict[str, Any]:
    """Fields named the same in SamplingOptions and the OpenAI body."""
    return {
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "top_k": opts.top_k,
        "min_p": opts.min_p,
        "presence_penalty": opts.presence_penalty,
        "frequency_penalty": opts.frequency_penalty,
        "repetition_penalty": opts.repetition_penalty,
        "sampling_seed": opts.seed,
        "n": opts.n,
    }


def _drop_none(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


def tokens_sampling_params(
    req: PreprocessedRequest,
    *,
    prompt_len: int,
    context_length: int,
    skip_tokenizer_init: bool,
) -> dict[str, Any]:
    """Tokens mode, from stop_conditions + sampling_options (Dynamo 1.6.1's preprocessed request).

    Stop strings go to the engine only when it has a tokenizer; without one the frontend
    matches them on its detokenized text. A tokenizer-free SGLang rejects min_new_tokens > 0,
    so then the floor is the frontend's job: the engine ignores EOS and the stop ids (the
    frontend ends the stream at the first stop id past the floor, which cancels the engine
    request).
    """
    stop = req.stop_conditions
    opts: SamplingOptions = req.sampling_options
    stop_ids = sorted(set(stop.stop_token_ids_hidden or ()) | set(stop.stop_token_ids or ()))
    min_tokens = stop.min_tokens
    ignore_eos = stop.ignore_eos
    frontend_floor = bool(min_tokens) and skip_tokenizer_init
    if frontend_floor:
        stop_ids, min_tokens, ignore_eos = [], None, True
    params = {
        **_common(opts),
        "max_new_tokens": completion_budget(stop.max_tokens, prompt_len, context_length),
        "min_new_tokens": min_tokens,
        "ignore_eos": ignore_eos,
        "stop_token_ids": stop_ids or None,
        "stop": None if skip_tokenizer_init else (stop.stop or None),
        "no_stop_trim": opts.include_stop_str_in_output,
        **guided_decoding_params(opts.guided_decoding),
    }
    return _drop_none(params)


def text_sampling_params(
    req: ChatCompletionRequest, *, prompt_len: int, context_length: int
) -> dict[str, Any]:
    """Text mode, from the OpenAI body (the engine has a tokenizer and detokenizes)."""
    params = {
        **_common(req),
        "max_new_tokens": completion_budget(req.completion_limit, prompt_len, context_length),
        "min_new_tokens": req.min_tokens,
        "ignore_eos": req.ignore_eos,
        "stop": req.stop or None,
        "stop_token_ids": sorted(set(req.stop_token_ids)) if req.stop_token_ids else None,
        "skip_special_tokens": req.skip_special_tokens,
        **text_guided_params(req.model_extra or {}),
    }
    return _drop_none(params)
