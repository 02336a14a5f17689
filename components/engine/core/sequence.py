"""Per-request state on the engine thread."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from components.engine.output.detokenizer import IncrementalDetokenizer, StopStringMatcher
from components.engine.kv.pool import PageRun
from components.engine.output.logprobs import TokenLogprob
from components.engine.output.sampling import SamplingState
from components.engine.output.sampling_params import SamplingParams

if TYPE_CHECKING:
    from components.engine.core.first_choices import FirstChoices
    from components.engine.output.grammar import RequestGrammar


class Status(enum.Enum):
    WAITING = "waiting"          # queued; no pages yet
    PREFILLING = "prefilling"    # pages allocated; prompt (chunks) being forwarded
    WAITING_KV = "waiting_kv"    # decode mode: pages allocated, waiting for the prefill's WRITE
    TRANSFERRING = "transferring"  # prefill mode: KV computed, waiting for the WRITE to finish
    RUNNING = "running"          # in the decode batch
    FINISHED = "finished"


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int
    room: int


# Receives (chunk dict, finished) on the engine thread; delivery to asyncio is its business.
ChunkSink = Callable[[dict[str, Any], bool], None]


@dataclass(eq=False)
class Sequence:
    rid: str
    params: SamplingParams
    sink: ChunkSink
    input_ids: list[int] | None = None
    prompt_text: str | None = None
    bootstrap: Bootstrap | None = None
    stream: bool = True               # False: only the final, cumulative chunk is sent
    reject: str | None = None         # found bad on the caller's side: ends with a 400 abort
    return_logprob: bool = False      # SGLang's Engine API flags (components/engine/output/logprobs.py)
    top_logprobs_num: int = 0
    logprob_start_len: int = -1       # >= 0: prompt logprobs from this position on
    created_at: float = field(default_factory=time.perf_counter)
    # n > 1 (components/engine/core/forks.py): this choice's index, the caller's rid, and on the
    # leader (choice 0) the other choices until its prompt's KV is forked into them.
    index: int | None = None
    parent_rid: str | None = None
    forks: list[Sequence] = field(default_factory=list)
    # Prefill mode with n > 1: the further choices' first-token samplers (first_choices.py).
    first_choices: FirstChoices | None = None

    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    pages: PageRun | None = None
    start_tok: int = -1               # pool token index of the first prompt token
    prefilled: int = 0                # prompt tokens scheduled into the pool so far
    cached_tokens: int = 0            # prompt tokens whose K/V came from the prefix cache
    max_new_tokens: int = 0           # effective budget: params capped by the context
    reserve_tokens: int = 0           # KV slots reserved at admission
    sampling: SamplingState | None = None
    detok: IncrementalDetokenizer | None = None
    stops: StopStringMatcher | None = None
    grammar: RequestGrammar | None = None  # structured output: compiled before submission
    finish_reason: dict[str, Any] | None = None
    # Streaming bookkeeping: what the caller has already received.
    num_sent_ids: int = 0
    unsent_text: str = ""
    first_token_at: float | None = None
    out_logprobs: list[TokenLogprob] = field(default_factory=list)  # aligned with output_ids
    # prompt logprobs: positions logprob_start_len + 1 .. prompt_len - 1, filled chunk by chunk
    in_logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids) if self.input_ids is not None else 0

    @property
    def kv_len(self) -> int:
        """Tokens whose K/V are in the pool: the prompt plus all outputs but the newest."""
        return self.prompt_len + max(len(self.output_ids) - 1, 0)

    def attach_pages(self, pages: PageRun, page_size: int) -> None:
        self.pages = pages
        self.start_tok = pages.start_page * page_size

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
