"""The engine thread's contract with the disaggregation coordinator (``disagg/coordinator.py``):
what the scheduler and the loop call on it (``Coordinator``), and the actions it returns to the
scheduler instead of calling back.

``disagg/`` sits above ``core/`` (it imports the sequence and these actions), so core names the
coordinator only by this shape, and whoever builds the engine hands it the maker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from components.engine.config import EngineConfig
from components.engine.kv.pool import KVPool, PageRun
from components.engine.output.logprobs import TokenLogprob
from components.engine.core.sequence import Sequence, Status


@dataclass(frozen=True)
class Adopt:
    """Decode: the KV is in place; the request joins the batch from ``first_token``."""

    seq: Sequence
    first_token: int
    logprob: TokenLogprob | None = None  # the prefill's, when the request asked for logprobs
    # n > 1: choices 1 .. n-1's first tokens (and logprobs), forked off the same prompt KV
    choices: tuple[tuple[int, TokenLogprob | None], ...] = ()


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


class Coordinator(Protocol):
    """Prefill/decode disaggregation on the engine thread, as the scheduler and the loop call it."""

    @property
    def bootstrap_port(self) -> int | None: ...

    @property
    def transfer_totals(self) -> Any: ...  # prefill: the transport's TransferTotals; decode: None

    def has_pending(self) -> bool: ...

    def check_new(self, seq: Sequence) -> None: ...

    def admit(self, seq: Sequence) -> list[Action]: ...

    def after_prefill(self, seq: Sequence, first_token: int) -> list[Action]: ...

    def on_finish(self, seq: Sequence, prev: Status) -> bool: ...

    def poll(self, timeout_s: float) -> list[Action]: ...

    def close(self) -> list[Action]: ...


# Builds the coordinator on the engine thread from the config, the KV pool and the vocabulary size.
MakeCoordinator = Callable[[EngineConfig, KVPool, int], Coordinator]
