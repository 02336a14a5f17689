"""Prefill mode, ``n > 1``: the prompt's one forward gives every choice its first token.

A decode engine forks an adopted prompt into its ``n`` choices as an aggregated one forks a
prefilled prompt (``forks.py``), but each choice's first token is sampled from the prompt's last
logits row, which only the prefill engine has. So the prefill runs the request as one row (its
KV computed and written once) and keeps a sampler for each further choice, seeded as that
choice's aggregated sampler (``choice_seed``). Each samples from its own copy of the row (taken
after the grammar mask: a fresh matcher masks the same for every choice, and before the leader's
sampler changes the row in place); the tokens, with their logprobs when asked for, leave in the
room's KV notification next to the leader's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from components.engine.output.logprobs import TokenLogprob, token_logprobs
from components.engine.output.sampling import SamplingFailed, SamplingState, sample

if TYPE_CHECKING:
    from components.engine.core.sequence import Sequence


@dataclass
class FirstChoices:
    """The samplers of choices 1 .. n-1, and once sampled, their first tokens in index order."""

    samplers: list[SamplingState]
    picks: list[tuple[int, TokenLogprob | None]] = field(default_factory=list)


def copy_rows(rows: list["Sequence"], logits: torch.Tensor
              ) -> list[tuple["Sequence", torch.Tensor]]:
    """The rows whose prompt completes in this forward and that carry further choices, each
    with a copy of its (masked, not yet sampled) logits row."""
    return [(seq, logits[i].clone()) for i, seq in enumerate(rows)
            if seq.first_choices is not None and not seq.first_choices.picks]


def sample_choices(copies: list[tuple["Sequence", torch.Tensor]]) -> dict[int, str]:
    """Sample each further choice's first token from its row's copy. -> ``id(seq)`` -> why a
    request failed (a choice's own parameters left nothing to sample, as its leader's would)."""
    failed: dict[int, str] = {}
    for seq, row in copies:
        choices = seq.first_choices
        k = len(choices.samplers)
        logits = row.unsqueeze(0).repeat(k, 1)
        tokens = sample(logits, choices.samplers)
        bad = next((t for t in tokens if isinstance(t, SamplingFailed)), None)
        if bad is not None:
            failed[id(seq)] = bad.message
            continue
        logprobs: list[TokenLogprob | None] = [None] * k
        if seq.return_logprob:
            params = [s.params for s in choices.samplers]
            logprobs = list(token_logprobs(
                logits, list(range(k)), [1.0 if p.is_greedy else p.temperature for p in params],
                tokens, [seq.top_logprobs_num] * k))
        choices.picks = list(zip(tokens, logprobs))
    return failed
