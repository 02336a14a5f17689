"""Turns last-position logits into next tokens, with SGLang's penalty and filter semantics.

Order as in SGLang: penalties and logit bias on raw logits (min_new_tokens masks the stop
tokens), then greedy argmax, or temperature -> softmax -> top_k / top_p / min_p -> renormalise ->
multinomial draw from the request's own ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from components.engine.output.sampling_params import SamplingParams


@dataclass
class SamplingState:
    """Per-request state the sampler needs: params, RNG, output history, stop-token set."""

    params: SamplingParams
    generator: torch.Generator | None
    stop_ids: tuple[int, ...]  # eos (unless ignore_eos) + stop_token_ids: masked by min_new_tokens
    output_ids: list[int]


def make_generator(params: SamplingParams, fallback_seed: int,
                   seed: int | None = None) -> torch.Generator | None:
    """``seed``: this choice's seed when it is not ``params.sampling_seed`` (n > 1)."""
    if params.is_greedy:
        return None
    g = torch.Generator()
    if seed is None:
        seed = params.sampling_seed
    if seed is None:
        seed = fallback_seed
    g.manual_seed(seed & (2**64 - 1))
    return g


@dataclass(frozen=True)
class SamplingFailed:
    """A row whose parameters made its distribution uncomputable; only that request fails."""

    message: str


@torch.inference_mode()
def sample(logits: torch.Tensor, states: list[SamplingState]) -> list[int | SamplingFailed]:
    """``logits`` [B, V] float32 (modified in place) -> one token id per row, or why the row's
    own parameters (penalties, bias, temperature) left nothing finite to sample from."""
    for row, st in zip(logits, states):
        _apply_penalties(row, st)
    # -inf is a mask (min_new_tokens); NaN or +inf means a row's own values overflowed.
    broken = (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1).tolist()
    out: list[int | SamplingFailed] = []
    for row, st, bad in zip(logits, states, broken):
        if bad:
            out.append(_failed("the penalties or logit_bias"))
        elif st.params.is_greedy:
            out.append(int(torch.argmax(row)))
        else:
            out.append(_draw(row, st.params, st.generator))
    return out


def _failed(cause: str) -> SamplingFailed:
    return SamplingFailed(
        f"sampling failed: {cause} of this request made the token probabilities non-finite "
        "in float32; use values closer to the defaults")


def _apply_penalties(row: torch.Tensor, st: SamplingState) -> None:
    p = st.params
    if p.has_penalties and st.output_ids:
        history = torch.tensor(st.output_ids, dtype=torch.long)
        ids, counts = torch.unique(history, return_counts=True)
        if p.repetition_penalty != 1.0:
            vals = row[ids]
            rp = p.repetition_penalty
            row[ids] = torch.where(vals < 0, vals * rp, vals / rp)
        if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            row[ids] -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty
    if p.logit_bias:
        for tid, bias in p.logit_bias.items():
            row[tid] += bias
    if len(st.output_ids) < p.min_new_tokens and st.stop_ids:
        row[list(st.stop_ids)] = float("-inf")


def _draw(row: torch.Tensor, p: SamplingParams,
          generator: torch.Generator | None) -> int | SamplingFailed:
    probs = torch.softmax(row / p.temperature, dim=-1)
    if not torch.isfinite(probs).all():  # every logit -inf, or overflow by the temperature
        return _failed("the temperature, penalties or logit_bias")
    if p.top_k == -1 and p.top_p >= 1.0 and p.min_p <= 0.0:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if p.top_k != -1:
        keep[p.top_k:] = False
    if p.top_p < 1.0:
        # Drop a token once the mass before it already exceeds top_p (the first always stays).
        keep &= (torch.cumsum(sorted_probs, 0) - sorted_probs) <= p.top_p
    if p.min_p > 0.0:
        keep &= sorted_probs >= sorted_probs[0] * p.min_p
    filtered = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    idx = int(torch.multinomial(filtered / filtered.sum(), 1, generator=generator))
    return int(order[idx])
