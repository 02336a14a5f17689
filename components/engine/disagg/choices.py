"""``n > 1`` across the KV transfer: one room carries the prompt's KV once, with every choice's
first token.

The prefill engine samples choices 1 .. n-1's first tokens from the prompt's one forward
(``core/first_choices.py``) and sends them in the room's notification after the leader's; the
decode engine checks that it got one for each of its choices before it forks the adopted KV
into them (``core/forks.py``, ``adopt_group``).
"""

from __future__ import annotations

from components.engine.core.sequence import Sequence
from components.engine.output.logprobs import first_to_wire
from protocol.kv_side_channel import ChoiceFirst


def choices_to_wire(seq: Sequence) -> tuple[ChoiceFirst, ...]:
    """Prefill: the further choices' first tokens (none with n = 1)."""
    if seq.first_choices is None:
        return ()
    return tuple(ChoiceFirst(token, first_to_wire([lp] if lp else [], seq.return_logprob))
                 for token, lp in seq.first_choices.picks)


def choices_problem(seq: Sequence, choices: tuple[ChoiceFirst, ...],
                    vocab_size: int) -> str | None:
    """Decode: why the prefill's choices cannot be adopted, or None. Each of the request's
    n - 1 further choices needs its own first token (a prefill asked with n = 1 sends none)."""
    wanted = seq.params.n - 1
    if len(choices) != wanted:
        return (f"prefill sent first tokens for {len(choices) + 1} choice(s), the request has "
                f"n={seq.params.n} (do both workers run this version?)")
    for c in choices:
        if not 0 <= c.token < vocab_size:
            return f"prefill sent first token {c.token} outside the vocabulary"
        if seq.return_logprob and c.logprob is None:
            return "prefill sent no logprobs for a choice's first token"
    return None
