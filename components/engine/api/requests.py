"""One ``CpuEngine.async_generate`` call -> the request's ``Sequence``, or a refusal.

What the call itself gets wrong raises ``ValueError`` at once (an unsupported Engine API
feature, a batch, text for an engine without a tokenizer, a bad rid). What SGLang refuses on the
stream's first read (bad sampling parameters, no input, bad logprob arguments) is kept on the
Sequence as ``reject`` and raised there (``engine_streams``).
"""

from __future__ import annotations

import uuid
from typing import Any

from components.engine.config import DisaggregationMode, EngineConfig
from components.engine.output.logprobs import check_logprob_args
from components.engine.output.sampling_params import SamplingParams
from components.engine.core.sequence import Bootstrap, Sequence

# Engine API parameters this engine cannot honour: passing a non-default value is an error.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "image_data": None, "audio_data": None, "video_data": None, "mm_hashes": None,
    "mm_content_hashes": None, "token_ids_logprob": None, "lora_path": None,
    "custom_logit_processor": None, "require_reasoning": False, "return_hidden_states": False,
    "return_routed_experts": False, "session_params": None, "session_id": None,
}


def checked_rid(given: dict[str, Any], cfg: EngineConfig) -> str:
    """Refuse what the call itself gets wrong; -> the request's rid (a fresh one if unset)."""
    for name, default in UNSUPPORTED_DEFAULTS.items():
        if given[name] != default:
            raise ValueError(f"{name} is not supported by the CPU engine")
    prompt, input_ids, rid = given["prompt"], given["input_ids"], given["rid"]
    if isinstance(prompt, list) or (input_ids and isinstance(input_ids[0], list)):
        raise ValueError("batched requests are not supported by the CPU engine; "
                         "call async_generate once per prompt")
    if input_ids is None and prompt is not None and cfg.skip_tokenizer_init:
        raise ValueError(
            "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
            "Please provide input_ids or re-initialize the engine with "
            "skip_tokenizer_init=False."
        )
    rid = rid if rid is not None else uuid.uuid4().hex
    if not isinstance(rid, str) or not rid:
        raise ValueError(f"rid must be a non-empty string, got {rid!r}")
    return rid


def make_sequence(rid: str, given: dict[str, Any], cfg: EngineConfig,
                  vocab_size: int) -> Sequence:
    """The request's Sequence, with ``reject`` set when SGLang would refuse it on first read."""
    prompt, input_ids = given["prompt"], given["input_ids"]
    reject = None
    try:
        params = SamplingParams.from_dict(given["sampling_params"], vocab_size)
    except ValueError as exc:
        params, reject = SamplingParams(), str(exc)
    reject = reject or _input_problem(prompt, input_ids)
    reject = reject or check_logprob_args(given["return_logprob"], given["top_logprobs_num"],
                                          given["logprob_start_len"])
    reject = reject or _dp_rank_problem(given["routed_dp_rank"], given["data_parallel_rank"])
    boot = None
    triple = (given["bootstrap_host"], given["bootstrap_port"], given["bootstrap_room"])
    if triple != (None, None, None):
        boot = Bootstrap(*triple)
    return Sequence(rid=rid, params=params, sink=_unset_sink,
                    input_ids=list(input_ids) if isinstance(input_ids, tuple) else input_ids,
                    prompt_text=prompt if input_ids is None else None,
                    bootstrap=boot, stream=given["stream"], reject=reject,
                    return_logprob=given["return_logprob"] is True,
                    top_logprobs_num=(given["top_logprobs_num"] or 0) if reject is None else 0,
                    logprob_start_len=_start_len(given["logprob_start_len"], reject))


def choice_rows(n: int, mode: DisaggregationMode) -> int:
    """The rows (and final chunks) a request with ``n`` choices runs as: ``n``, but one on a
    prefill engine, which samples the other choices' first tokens from that row and sends
    them with the one KV transfer (core/first_choices.py)."""
    return 1 if mode == DisaggregationMode.PREFILL else max(n, 1)


def _start_len(given: Any, reject: str | None) -> int:
    """-1 (no prompt logprobs) unless a valid start was given; checked against the prompt's
    length on the engine thread (``check_start_len``)."""
    return given if reject is None and isinstance(given, int) and given >= 0 else -1


def _input_problem(prompt: Any, input_ids: Any) -> str | None:
    if input_ids is None and prompt is None:
        return "Either text, input_ids or input_embeds should be provided."
    if input_ids is None and not isinstance(prompt, str):
        return f"prompt must be a string, got {type(prompt).__name__}"
    return None  # input_ids are checked on the engine thread (vocabulary, length)


def _dp_rank_problem(routed: Any, legacy: Any) -> str | None:
    """SGLang's TokenizerManager check: this engine is one data-parallel rank (0); a router's
    rank 0 is taken, any other is out of range (`disagg_prefill_dp_rank` names the prefill's
    rank, 0 too, and needs no check: the room's bootstrap finds it)."""
    rank = routed if routed is not None else legacy
    if rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and rank == 0):
        return None
    return f"routed_dp_rank={rank} out of range [0, 1)"


def _unset_sink(chunk: dict[str, Any], final: bool) -> None:
    raise RuntimeError("sequence submitted without a sink")
