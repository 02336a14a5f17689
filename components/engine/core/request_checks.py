"""Checks a request before it is queued; every failure is a message for a 400 abort."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.engine.config import DisaggregationMode
from components.engine.core.sequence import Bootstrap, Sequence
from components.engine.output.logprobs import check_start_len
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, host_problem
from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM



@dataclass(frozen=True)
class Limits:
    vocab_size: int
    context_length: int
    pool_tokens: int
    disaggregation_mode: DisaggregationMode


class InvalidRequest(ValueError):
    """A client error: the request ends with an abort carrying status 400 and this message."""


def check_request(seq: Sequence, tokenizer: Any, limits: Limits, choices: int) -> None:
    """Every check, in admission's order; fills in what they settle (``input_ids``,
    ``max_new_tokens``, ``reserve_tokens``). Raises InvalidRequest."""
    if seq.reject is not None:  # found bad on the caller's side (api/requests.py)
        raise InvalidRequest(seq.reject)
    tokenize_prompt(seq, tokenizer)
    seq.input_ids = check_input_ids(seq.input_ids, limits)
    problem = check_start_len(seq.logprob_start_len if seq.return_logprob else -1,
                              len(seq.input_ids),
                              limits.disaggregation_mode != DisaggregationMode.DECODE)
    if problem is not None:
        raise InvalidRequest(problem)
    check_bootstrap(seq, limits)
    seq.reserve_tokens = plan_budget(seq, limits, choices)


def tokenize_prompt(seq: Sequence, tokenizer: Any) -> None:
    """Text prompt -> ``seq.input_ids`` (on the engine thread, with its own tokenizer copy)."""
    if seq.input_ids is not None or seq.prompt_text is None:
        return
    if tokenizer is None:
        raise InvalidRequest(
            "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
            "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False."
        )
    try:
        seq.input_ids = tokenizer(seq.prompt_text, add_special_tokens=True,
                                  return_attention_mask=False)["input_ids"]
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"could not tokenize the prompt: {exc}") from exc


def check_input_ids(ids: Any, limits: Limits) -> list[int]:
    if not isinstance(ids, list):
        raise InvalidRequest(f"input_ids must be a list of token ids, got {type(ids).__name__}")
    if not ids:
        raise InvalidRequest("The input is empty: input_ids has no tokens")
    if not all(type(t) is int for t in ids):
        bad = next(t for t in ids if type(t) is not int)
        raise InvalidRequest(f"input_ids must hold integers, got {bad!r}")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= limits.vocab_size:
        bad = lo if lo < 0 else hi
        raise InvalidRequest(
            f"Token id {bad} in input_ids is out of the vocabulary range "
            f"[0, {limits.vocab_size - 1}]"
        )
    if len(ids) >= limits.context_length:  # SGLang's TokenizerManager check and message
        raise InvalidRequest(
            f"The input ({len(ids)} tokens) is longer than the model's context length "
            f"({limits.context_length} tokens)."
        )
    return ids


def check_bootstrap(seq: Sequence, limits: Limits) -> None:
    mode = limits.disaggregation_mode
    if mode == DisaggregationMode.NULL:
        return
    if seq.bootstrap is None:
        raise InvalidRequest(
            f"A {mode}-mode engine needs bootstrap_host, bootstrap_port and bootstrap_room "
            "on every request"
        )
    problem = bootstrap_problem(seq.bootstrap)
    if problem is not None:
        raise InvalidRequest(problem)


def bootstrap_problem(boot: Bootstrap) -> str | None:
    """Why the triple names no room on a reachable bootstrap server (None: it does)."""
    room = boot.room
    if boot.host == FAKE_BOOTSTRAP_HOST and type(room) is int and 0 <= room <= MAX_BOOTSTRAP_ROOM:
        return None
    if type(room) is not int or not MIN_BOOTSTRAP_ROOM <= room <= MAX_BOOTSTRAP_ROOM:
        return f"bootstrap_room must be an integer in [1, 2**63), got {room!r}"
    if type(boot.port) is not int or not 1 <= boot.port <= 65535:
        return f"bootstrap_port must be an integer in [1, 65535], got {boot.port!r}"
    problem = host_problem(boot.host)
    return None if problem is None else f"bootstrap_host: {problem}"


def plan_budget(seq: Sequence, limits: Limits, choices: int = 1) -> int:
    """Set ``seq.max_new_tokens`` (capped by the context) and return the KV tokens to reserve
    (per choice: with n > 1 every choice holds its own copy of the prompt)."""
    room_left = limits.context_length - seq.prompt_len
    wanted = seq.params.max_new_tokens
    if wanted is not None and wanted > room_left:  # SGLang refuses rather than clamps
        total = seq.prompt_len + wanted
        raise InvalidRequest(
            "Requested token count exceeds the model's maximum context length of "
            f"{limits.context_length} tokens. You requested a total of {total} tokens: "
            f"{seq.prompt_len} tokens from the input messages and {wanted} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.")
    seq.max_new_tokens = room_left if wanted is None else wanted
    if limits.disaggregation_mode == DisaggregationMode.PREFILL:
        need = seq.prompt_len  # only the prompt's K/V is computed and sent
    else:
        need = seq.prompt_len + max(seq.max_new_tokens, 1)
    if need * choices > limits.pool_tokens:
        raise InvalidRequest(
            f"The request needs KV space for {need * choices} tokens"
            + (f" ({choices} choices of {need})" if choices > 1 else "")
            + f" but the engine's KV pool holds {limits.pool_tokens} (max_total_tokens)"
        )
    return need
