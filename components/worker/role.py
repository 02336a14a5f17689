"""What this worker is, decided once from its flags: aggregated, prefill or decode; who starts
a disaggregated request's prefill; which input mode it serves. Everything else reads these
properties instead of combining mode, orchestrator and input mode itself.
(docs/reference/input-modes.md and docs/reference/orchestration.md.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from handlers.disagg.orchestration import Orchestration


class WorkerMode(Enum):
    AGGREGATED = "agg"
    PREFILL = "prefill"
    DECODE = "decode"

    @classmethod
    def from_disaggregation_mode(cls, value: str) -> "WorkerMode":
        # SGLang spells aggregated as "null".
        return {"null": cls.AGGREGATED, "prefill": cls.PREFILL, "decode": cls.DECODE}[value]


class Orchestrator(Enum):
    """Who starts a disaggregated request's prefill (`--disagg-orchestrator`)."""
    FRONTEND = "frontend"  # Dynamo 1.6.1's prefill router: both legs register
    DECODE = "decode"  # the decode worker calls the prefill endpoint itself

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        return tuple(o.value for o in cls)

    @classmethod
    def parse(cls, value: str) -> "Orchestrator":
        try:
            return cls(value)
        except ValueError:
            raise SystemExit(f"--disagg-orchestrator must be one of {cls.choices()}, "
                             f"got {value!r}") from None

    @classmethod
    def default(cls, skip_tokenizer_init: bool) -> "Orchestrator":
        # The frontend orchestrates only requests it tokenizes (Tokens mode).
        return cls.FRONTEND if skip_tokenizer_init else cls.DECODE


@dataclass(frozen=True)
class WorkerRole:
    mode: WorkerMode
    orchestrator: Orchestrator
    skip_tokenizer_init: bool  # Tokens mode: the frontend tokenizes; else Text mode
    # A decode worker whose engine keeps a prefix cache (SGLang's
    # --disaggregation-decode-enable-radix-cache): its prefill sends only what the cache lacks.
    decode_cache: bool = False

    def __post_init__(self) -> None:
        # The frontend's prefill router runs in its preprocessing pipeline, which a Text-mode
        # model (raw chat bodies) bypasses: refuse at startup, not per request.
        if self.frontend_orchestrated and not self.skip_tokenizer_init:
            raise SystemExit("--disagg-orchestrator frontend needs --skip-tokenizer-init (Tokens "
                             "mode): the frontend orchestrates only requests it tokenizes; use "
                             "--disagg-orchestrator decode for Text mode")

    @property
    def aggregated(self) -> bool:
        return self.mode is WorkerMode.AGGREGATED

    @property
    def prefill(self) -> bool:
        return self.mode is WorkerMode.PREFILL

    @property
    def decode(self) -> bool:
        return self.mode is WorkerMode.DECODE

    @property
    def text_mode(self) -> bool:
        return not self.skip_tokenizer_init

    @property
    def orchestration(self) -> Orchestration:
        """Who starts this worker's prefill legs, the one value both handlers get: none when
        aggregated, else the flag's (`--disagg-orchestrator`)."""
        if self.aggregated:
            return Orchestration.NONE
        return {Orchestrator.FRONTEND: Orchestration.FRONTEND,
                Orchestrator.DECODE: Orchestration.DECODE}[self.orchestrator]

    @property
    def frontend_orchestrated(self) -> bool:
        """Disaggregated, with the frontend's prefill router starting each prefill."""
        return self.orchestration is Orchestration.FRONTEND

    @property
    def calls_prefill(self) -> bool:
        """A decode worker that sends each request's prefill to a prefill worker itself."""
        return self.decode and self.orchestration is Orchestration.DECODE

    @property
    def receives_rooms(self) -> bool:
        """A decode worker whose requests carry the room the frontend drew (`bootstrap_info`)."""
        return self.decode and self.orchestration is Orchestration.FRONTEND

    @property
    def claims_rooms(self) -> bool:
        """A decode worker, which claims each request's room at its prefill's room watch (both
        styles: decode-orchestrated, Dynamo 1.6.1's runtime can lose the stop the decode sends
        down the prefill's stream, so the watch is what ends an abandoned prefill leg)."""
        return self.decode

    @property
    def registers(self) -> bool:
        """Registers with the frontend; a decode-orchestrated prefill serves a private endpoint."""
        return not (self.prefill and self.orchestration is Orchestration.DECODE)

    @property
    def streams_tokens(self) -> bool:
        """Streams generated tokens to its caller (a prefill answers with its hand-off)."""
        return not self.prefill

    @property
    def default_component(self) -> str:
        return "prefill" if self.prefill else "backend"
