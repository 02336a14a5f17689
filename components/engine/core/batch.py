"""What the scheduler hands the model runner for one forward, and what comes back to it."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.engine.core.sequence import Sequence


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens ``begin..end`` of ``seq`` (the whole prompt unless chunked)."""

    seq: Sequence
    begin: int
    end: int

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.seq.prompt_len


@dataclass
class Batch:
    """One forward's rows: prompt chunks and decode rows (one new token each)."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)

    @property
    def prefill_tokens(self) -> int:
        return sum(c.end - c.begin for c in self.prefill)

    @property
    def sampled(self) -> list[Sequence]:
        """The rows that get a next token from this forward, in logits order."""
        return [c.seq for c in self.prefill if c.completes_prompt] + self.decode
