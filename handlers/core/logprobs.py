"""Logprobs: the request's ask -> SGLang's Engine API kwargs; the engine's ``meta_info`` ->
what the frontend renders.

Engine side (both engines): ``return_logprob``, ``top_logprobs_num``; chunks carry
``output_token_logprobs`` ``[(logprob, token_id, text|None)]`` aligned with their ``output_ids``
and, when ``top_logprobs_num > 0``, ``output_top_logprobs`` (one list per token, best first).

Tokens mode yields Dynamo's wire format (as Dynamo's own SGLang handler does): ``log_probs``
``[float]`` and ``top_logprobs`` ``[[{rank, token_id, token, logprob}]]``; the 1.6.1 frontend
renders both ``/v1/chat/completions`` and ``/v1/completions`` logprobs from them.
Text mode yields OpenAI's ``choices[].logprobs.content[]`` ``{token, logprob, bytes,
top_logprobs}``; the token text comes from the worker's tokenizer.
"""

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Optional

from handlers.core.errors import RequestError
from protocol.chat import ChatCompletionRequest
from protocol.limits import MAX_TOP_LOGPROBS
from protocol.outputs import ChatTokenLogprob, ChatTopLogprob, ChoiceLogprobs, TopLogprob
from protocol.preprocessed import OutputOptions

TOKEN_TEXT_CACHE = 1 << 16  # distinct token ids whose text/bytes are kept


def _engine_kwargs(top: int) -> dict[str, Any]:
    return {"return_logprob": True, "top_logprobs_num": top}


def tokens_logprob_kwargs(opts: OutputOptions) -> dict[str, Any]:
    """Tokens mode: ``output_options.logprobs`` (the frontend's mapping of chat
    ``logprobs``/``top_logprobs`` and completions ``logprobs``) and
    ``output_options.prompt_logprobs`` (completions' ``echo``, which the 1.6.1 frontend sends as
    1, or the body's ``prompt_logprobs``) -> engine kwargs, as Dynamo's SGLang worker maps them:
    prompt logprobs are SGLang's from position 0 (``logprob_start_len=0``), one top-k for both."""
    kwargs: dict[str, Any] = {}
    if opts.logprobs is not None:
        _check_top("output_options.logprobs (from logprobs/top_logprobs)", opts.logprobs)
        kwargs = _engine_kwargs(opts.logprobs)
    if opts.prompt_logprobs is not None:
        _check_top("output_options.prompt_logprobs (from echo/prompt_logprobs)",
                   opts.prompt_logprobs)
        top = max(kwargs.get("top_logprobs_num", 0), opts.prompt_logprobs)
        kwargs = {**_engine_kwargs(top), "logprob_start_len": 0}
    return kwargs


def _check_top(field: str, value: int) -> None:
    if not 0 <= value <= MAX_TOP_LOGPROBS:
        raise RequestError(f"{field} must be in [0, {MAX_TOP_LOGPROBS}], got {value}")


def text_logprob_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """Text mode: OpenAI's ``logprobs`` (bool) and ``top_logprobs`` (0..20, needs logprobs)."""
    body = req.model_extra or {}
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError(f"logprobs must be a boolean, got {wanted!r}")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                               f"got {top!r}")
        if top > 0 and not wanted:
            raise RequestError("top_logprobs: logprobs must be true when top_logprobs is set")
    return _engine_kwargs(top or 0) if wanted else {}


def prefill_request_options(kwargs: dict[str, Any]) -> OutputOptions:
    """What decode tells the prefill so it computes the first token's logprobs too."""
    if not kwargs:
        return OutputOptions()
    return OutputOptions(logprobs=kwargs["top_logprobs_num"])


def tokens_fields(meta: dict[str, Any], top: Optional[int] = None) -> dict[str, Any]:
    """``meta_info`` -> TokenDelta's ``log_probs``/``top_logprobs`` (empty when not asked);
    ``top``: at most that many alternatives (the engine's top-k also serves prompt logprobs)."""
    entries = meta.get("output_token_logprobs")
    if not entries:
        return {}
    out: dict[str, Any] = {"log_probs": [float(e[0]) for e in entries]}
    tops = meta.get("output_top_logprobs")
    if tops and top != 0:
        out["top_logprobs"] = [
            [TopLogprob(rank, int(t[1]), t[2], float(t[0]))
             for rank, t in enumerate(pos[:top], 1)]
            for pos in tops
        ]
    return out


def prompt_logprobs_payload(meta: dict[str, Any], top: int) -> Optional[list[Any]]:
    """SGLang's ``input_token_logprobs`` / ``input_top_logprobs`` -> Dynamo's
    ``engine_data.prompt_logprobs``: per prompt position None (the first: nothing precedes it)
    or ``{str(token_id): {"logprob", "rank"?}}``, the prompt's own token and ``top``
    alternatives (rank from 1), as Dynamo's SGLang worker builds it."""
    entries = meta.get("input_token_logprobs")
    if not entries:
        return None
    tops = meta.get("input_top_logprobs") or []
    out: list[Any] = []
    for i, (lp, tid, _) in enumerate(entries):
        if lp is None:
            out.append(None)
            continue
        pos: dict[str, dict[str, Any]] = {str(int(tid)): {"logprob": float(lp)}}
        alts = (tops[i] if i < len(tops) else None) or ()
        for rank, (alt_lp, alt_id, _) in enumerate(alts[:top], 1):
            pos.setdefault(str(int(alt_id)), {"logprob": float(alt_lp)})["rank"] = rank
        out.append(pos)
    return out


class ChatLogprobs:
    """Text mode: ``meta_info`` -> ``ChoiceLogprobs``, token text from the tokenizer that
    ``tokenizer_of()`` returns (read on use: the handler's preprocessor owns it). One per
    handler: the token-text cache is shared by its requests."""

    def __init__(self, tokenizer_of: Callable[[], Any]) -> None:
        self._text = lru_cache(maxsize=TOKEN_TEXT_CACHE)(
            lambda t: _token_text(tokenizer_of(), t))

    def convert(self, meta: dict[str, Any]) -> Optional[ChoiceLogprobs]:
        entries = meta.get("output_token_logprobs")
        if not entries:
            return None
        tops = meta.get("output_top_logprobs") or [()] * len(entries)
        content = []
        for (lp, tid, _), top in zip(entries, tops):
            text, raw = self._text(int(tid))
            alts = []
            for alt_lp, alt_id, _ in top:
                alt_text, alt_raw = self._text(int(alt_id))
                alts.append(ChatTopLogprob(alt_text, float(alt_lp), alt_raw))
            content.append(ChatTokenLogprob(text, float(lp), raw, alts))
        return ChoiceLogprobs(content)


def _token_text(tokenizer: Any, token_id: int) -> tuple[str, list[int]]:
    """(text, UTF-8 bytes) of one token. A byte-level BPE token that is part of a multi-byte
    character decodes to U+FFFD; its bytes then come from the token's own byte string."""
    text = tokenizer.decode([token_id])
    raw = text.encode("utf-8")
    if "\ufffd" in text:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        table = _byte_decoder()
        if isinstance(piece, str) and piece and all(c in table for c in piece):
            raw = bytes(table[c] for c in piece)
    return text, list(raw)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable stand-in character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}
