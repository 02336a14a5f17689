"""Per-token logprobs with SGLang 0.5.x's semantics (``sglang/srt/layers/sampler.py``).

Which distribution: the logits after penalties, logit bias and the min_new_tokens mask, divided
by the temperature (greedy rows: temperature 1, as SGLang turns them into top_k=1), before
top-k / top-p / min-p filtering; ``log(softmax(.))`` clamped to float32's lowest value so a
masked token reads as a very negative number, never -inf. Only the rows that asked are computed,
in one batched pass, so a batch without logprob rows pays nothing.

Chunks carry them as SGLang's ``meta_info``: ``output_token_logprobs`` ``[(logprob, token_id,
None)]`` and, when ``top_logprobs_num > 0``, ``output_top_logprobs`` ``[[(logprob, token_id,
None)] * top_logprobs_num]``, best first (the Engine API returns no token text in them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from protocol.kv_side_channel import FirstLogprob
from protocol.limits import MAX_TOP_LOGPROBS

@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its logprob and the best ``top_logprobs_num`` (logprob, id) pairs."""

    logprob: float
    top: tuple[tuple[float, int], ...] = ()


def check_logprob_args(return_logprob: Any, top_logprobs_num: Any,
                       logprob_start_len: Any) -> str | None:
    """-> why these Engine API arguments cannot be served, or None."""
    if not isinstance(return_logprob, bool):
        return f"return_logprob must be a boolean, got {return_logprob!r}"
    num = top_logprobs_num
    if num is not None and (isinstance(num, bool) or not isinstance(num, int)
                            or not 0 <= num <= MAX_TOP_LOGPROBS):
        return f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {num!r}"
    start = logprob_start_len
    if start is not None and (isinstance(start, bool) or not isinstance(start, int) or start < -1):
        return f"logprob_start_len must be an integer >= -1, got {start!r}"
    return None


def check_start_len(start: int, prompt_len: int, computes_prompt: bool) -> str | None:
    """SGLang's scheduler check (on the engine thread, where the prompt's length is known);
    a decode-mode engine never runs the prompt's forward, so it cannot honour one at all."""
    if start < 0:
        return None
    if not computes_prompt:
        return ("logprob_start_len (prompt logprobs): a decode-mode engine does not run the "
                "prompt's forward; the prefill engine computes them")
    if start > prompt_len:
        return (f"req.logprob_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={prompt_len}. Please use a smaller "
                "logprob_start_len.")
    return None


@torch.inference_mode()
def prompt_logprobs(logits: torch.Tensor, next_tokens: list[int],
                    top_num: int) -> list[TokenLogprob]:
    """``logits`` [P, V]: the prompt positions whose next prompt token is ``next_tokens[i]``;
    raw logits (temperature 1), as SGLang's input logprobs."""
    logp = torch.log_softmax(logits, dim=-1)
    logp.clamp_(min=torch.finfo(logp.dtype).min)
    chosen = logp.gather(1, torch.tensor(next_tokens, dtype=torch.long).unsqueeze(1)).squeeze(1)
    if top_num <= 0:
        return [TokenLogprob(lp) for lp in chosen.tolist()]
    vals, ids = torch.topk(logp, top_num, dim=-1)
    return [TokenLogprob(lp, tuple(zip(v, i)))
            for lp, v, i in zip(chosen.tolist(), vals.tolist(), ids.tolist())]


def input_meta_fields(input_ids: list[int], start: int, entries: list[TokenLogprob],
                      top_num: int) -> dict[str, Any]:
    """SGLang's ``input_token_logprobs`` / ``input_top_logprobs`` from ``start`` on: the first
    position has no logprob (None), each later one the logprob its predecessor gave it."""
    ids = input_ids[start:]
    if not ids:  # start == the prompt's length: SGLang returns nothing for the prompt
        return {"input_token_logprobs": []}
    meta: dict[str, Any] = {"input_token_logprobs": [(None, ids[0], None)] + [
        (e.logprob, t, None) for e, t in zip(entries, ids[1:])]}
    if top_num > 0:
        meta["input_top_logprobs"] = [None] + [
            [(lp, t, None) for lp, t in e.top] for e in entries]
    return meta


@torch.inference_mode()
def token_logprobs(logits: torch.Tensor, rows: list[int], temperatures: list[float],
                   tokens: list[int], top_nums: list[int]) -> list[TokenLogprob]:
    """``logits`` [B, V] as the sampler left them (penalties applied in place); for each of
    ``rows``: the logprob of ``tokens[i]`` and the top ``top_nums[i]`` entries."""
    picked = logits[rows] if len(rows) != logits.shape[0] else logits
    temps = torch.tensor(temperatures, dtype=picked.dtype).unsqueeze(1)
    logp = torch.log_softmax(picked / temps, dim=-1)
    logp.clamp_(min=torch.finfo(logp.dtype).min)
    chosen = logp.gather(1, torch.tensor(tokens, dtype=torch.long).unsqueeze(1)).squeeze(1)
    k = max(top_nums)
    top_vals: list[list[float]] = [[] for _ in rows]
    top_ids: list[list[int]] = [[] for _ in rows]
    if k > 0:
        vals, ids = torch.topk(logp, k, dim=-1)
        top_vals, top_ids = vals.tolist(), ids.tolist()
    return [
        TokenLogprob(lp, tuple(zip(vals[:n], ids[:n])))
        for lp, vals, ids, n in zip(chosen.tolist(), top_vals, top_ids, top_nums)
    ]


def first_to_wire(seq_logprobs: list[TokenLogprob], wanted: bool) -> FirstLogprob | None:
    """Prefill: the first token's entry for the KV notification (decode emits it)."""
    if not wanted or not seq_logprobs:
        return None
    first = seq_logprobs[0]
    return FirstLogprob(first.logprob, list(first.top))


def first_from_wire(wire: FirstLogprob | None) -> TokenLogprob | None:
    if wire is None:
        return None
    return TokenLogprob(wire.logprob, tuple((lp, t) for lp, t in wire.top))


def meta_fields(entries: list[TokenLogprob], ids: list[int], top_num: int) -> dict[str, Any]:
    """SGLang's ``meta_info`` logprob fields for the chunk carrying ``ids``."""
    meta: dict[str, Any] = {
        "output_token_logprobs": [(e.logprob, t, None) for e, t in zip(entries, ids)],
    }
    if top_num > 0:
        meta["output_top_logprobs"] = [[(lp, t, None) for lp, t in e.top] for e in entries]
    return meta
