"""What the disaggregation coordinator asks of the scheduler (``coordinator.py``): actions it
returns instead of calling back, and the one table of what a client sees when a room's KV
transfer fails."""

from __future__ import annotations

from dataclasses import dataclass

from components.engine.disagg.transport.events import FailureKind
from components.engine.kv.pool import PageRun
from components.engine.output.logprobs import TokenLogprob
from components.engine.core.sequence import Sequence

TIMEOUT_STATUS = 504
FAILURE_STATUS = 500
INVALID_STATUS = 400  # the request itself was refused (the engine's 400s)
UNAVAILABLE_STATUS = 503  # this pairing cannot serve now; another prefill (or later) can
# What the client sees when a room's transfer fails, by the failure's kind.
FAILURE_STATUS_BY_KIND = {
    FailureKind.TIMED_OUT: TIMEOUT_STATUS,
    FailureKind.PEER_LOST: FAILURE_STATUS,
    FailureKind.REFUSED: FAILURE_STATUS,
    FailureKind.NIXL_ERROR: FAILURE_STATUS,
    FailureKind.ABORTED: FAILURE_STATUS,
    FailureKind.INVALID: INVALID_STATUS,  # the prefill refused the request: the client's error
    FailureKind.PATH_BROKEN: UNAVAILABLE_STATUS,  # the KV path failed its probe (path_probe.py)
}


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
