"""What the disaggregation coordinator asks of the scheduler (``disagg/coordinator.py``):
actions it returns instead of calling back."""

from __future__ import annotations

from dataclasses import dataclass

from components.engine.kv.pool import PageRun
from components.engine.output.logprobs import TokenLogprob
from components.engine.core.sequence import Sequence


@dataclass(frozen=True)
class Adopt:
    """Decode: the KV is in place; the request joins the batch from ``first_token``."""

    seq: Sequence
    first_token: int
    logprob: TokenLogprob | None = None  # the prefill's, when the request asked for logprobs


@dataclass(frozen=True)
class Complete:
    """Prefill: KV and first token are in decode memory; finish with SGLang's single chunk."""

    seq: Sequence
    first_token: int


@dataclass(frozen=True)
class Fail:
    seq: Sequence
    message: str
    status_code: int


@dataclass(frozen=True)
class Free:
    """No peer can touch these pages any more."""

    pages: PageRun


Action = Adopt | Complete | Fail | Free
