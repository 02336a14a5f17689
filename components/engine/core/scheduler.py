"""Continuous batching on the engine thread: who runs in the next forward, and what follows.

One engine step is ``schedule() -> runner.forward(batch) -> processor.postprocess(batch, logits)
-> update(batch, outcomes)``. ``schedule`` admits waiting requests (FIFO) within the running
and prefill-token budgets, allocates their pages and returns either a prefill batch (several
prompts, or chunks of one, in one forward) or a decode batch (every running row). Running rows
get a decode step between two prefill steps, so admissions never starve them. With SGLang's
``enable_mixed_chunk`` the prefill chunks and the decode rows share one forward instead.

Disaggregation (prefill or decode mode) is behind a ``Coordinator`` (``actions.py``), called at
four points: ``check_new``/``admit`` on admission, ``after_prefill``, ``on_finish``, and
``poll``. Its calls never come back into the scheduler: they return actions that ``_apply``
carries out.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from components.engine.core.batch import Batch, PrefillChunk
from components.engine.config import DisaggregationMode
from components.engine.core.actions import Action, Adopt, Complete, Coordinator, Fail, Free
from components.engine.core.forks import (
    adopt_group, allocate_group, fork_kv, group_rows, pending, share_plan,
)
from components.engine.kv.pool import KVPool, PageRun
from components.engine.core.processor import (
    FinishReason, OutputProcessor, finish_abort, finish_length,
)
from components.engine.kv.prefix_cache import PrefixCache
from components.engine.core.request_checks import InvalidRequest, Limits, check_request
from components.engine.core.sequence import Sequence, Status

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int | None  # None: a prompt is always prefilled whole
    enable_mixed_chunk: bool = False  # prefill chunks ride in the running rows' decode forward


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, limits: Limits, pool: KVPool,
                 processor: OutputProcessor, tokenizer: Any,
                 disagg: Coordinator | None, cache: PrefixCache | None = None) -> None:
        self.cfg = cfg
        self.limits = limits
        self.pool = pool
        self.processor = processor
        self.tokenizer = tokenizer
        self.disagg = disagg
        self.cache = cache
        self._mode = limits.disaggregation_mode
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.live: dict[str, Sequence] = {}
        self._chunked: Sequence | None = None  # a prompt part-way through chunked prefill
        self._stalled = False  # the queue head does not fit in the pool until pages are freed
        self._decode_due = False  # the last step prefilled: running rows go next

    # ---- requests in and out ----------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """A request, with its other choices on ``seq.forks`` when n > 1 (``forks.py``)."""
        group = [seq, *seq.forks]
        for row in group:
            self.live[row.rid] = row
        try:
            check_request(seq, self.tokenizer, self.limits, len(group))
            if self.disagg is not None:
                self.disagg.check_new(seq)
        except InvalidRequest as exc:
            self.finish(seq, finish_abort(str(exc), 400))  # and its other choices
            return
        share_plan(seq)
        for row in group:
            self.processor.init_request(row)
        self.waiting.append(seq)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        if abort_all:
            targets = list(self.live.values())
        elif rid in self.live:
            targets = [self.live[rid]]
        else:  # the caller's rid of an n > 1 request: every choice (SGLang ignores it)
            targets = [s for s in self.live.values() if s.parent_rid == rid]
        for seq in targets:
            logger.info("abort rid=%s (%s)", seq.rid, seq.status.value)
            self.finish(seq, finish_abort("Aborted"))

    def abort_everything(self, message: str, status_code: int | None) -> None:
        for seq in list(self.live.values()):
            self.finish(seq, finish_abort(message, status_code))

    def has_compute_work(self) -> bool:
        return bool(self.running or self._chunked) or (self._admissible() and not self._stalled)

    # ---- schedule ---------------------------------------------------------------------------
    def schedule(self) -> Batch:
        mixed = self.cfg.enable_mixed_chunk
        if self.running and self._decode_due and not mixed:
            self._decode_due = False
            return Batch(decode=list(self.running))
        batch = Batch(prefill=self._prefill_chunks())
        if batch.prefill and not mixed:
            self._decode_due = True
            return batch
        batch.decode = list(self.running)  # rows admitted above join once prefilled
        return batch

    def _prefill_chunks(self) -> list[PrefillChunk]:
        chunks: list[PrefillChunk] = []
        # As SGLang's PrefillAdder: with chunking, a step's new tokens together stay within one
        # chunk, so a step (what an abort or a short request waits behind) is one chunk's forward.
        budget = self.cfg.max_prefill_tokens
        if self._can_chunk():
            budget = min(budget, self.cfg.chunked_prefill_size)
        if self._chunked is not None:
            chunks.append(self._next_chunk(self._chunked, budget))
            budget -= chunks[-1].end - chunks[-1].begin
        while self._admissible() and self._chunked is None:
            seq = self.waiting[0]
            if seq.max_new_tokens == 0 and self._mode == DisaggregationMode.NULL:
                self.waiting.popleft()
                self.finish(seq, finish_length(0))
                continue
            if chunks and (budget <= 0 or (seq.prompt_len > budget and not self._can_chunk())):
                break  # the first prompt of a step always goes, however long
            if not allocate_group(seq, self._allocate, self._release, self.pool.page_size):
                self._stalled = True  # FIFO: wait until a finishing request frees pages
                break
            self.waiting.popleft()
            if self._mode == DisaggregationMode.DECODE:
                if self.cache is not None:  # the prefill sends only what the cache lacks
                    seq.prefilled = self.cache.reuse(seq.input_ids, seq.start_tok)
                self._apply(self.disagg.admit(seq))  # the prefill engine computes the prompt
                continue
            seq.status = Status.PREFILLING
            if self.cache is not None:
                # As SGLang: prompt logprobs need the logits from their start on, so the
                # cached prefix stops there.
                ids = (seq.input_ids[:seq.logprob_start_len + 1] if seq.wants_prompt_logprobs
                       else seq.input_ids)
                seq.cached_tokens = seq.prefilled = self.cache.reuse(ids, seq.start_tok)
            chunks.append(self._next_chunk(seq, budget))
            budget -= chunks[-1].end - chunks[-1].begin
        return chunks

    def _allocate(self, tokens: int) -> PageRun | None:
        if self.cache is not None:
            return self.cache.allocate(tokens)  # cached prefixes yield to requests
        return self.pool.allocate(tokens)

    def _can_chunk(self) -> bool:
        return self.cfg.chunked_prefill_size is not None

    def _next_chunk(self, seq: Sequence, budget: int) -> PrefillChunk:
        size = seq.prompt_len - seq.prefilled
        if self._can_chunk():
            size = min(size, self.cfg.chunked_prefill_size, max(budget, 1))
        chunk = PrefillChunk(seq, seq.prefilled, seq.prefilled + size)
        seq.prefilled = chunk.end
        self._chunked = None if chunk.completes_prompt else seq
        return chunk

    def _admissible(self) -> bool:
        # The queue head fits in max_running_requests with all its choices, or runs alone.
        if not self.waiting:
            return False
        active = self._active()
        return active == 0 or active + group_rows(self.waiting[0]) <= self.cfg.max_running_requests

    def _active(self) -> int:
        return len(self.live) - sum(group_rows(s) for s in self.waiting)

    # ---- apply a forward's outcomes, and the peer's -----------------------------------------
    def update(self, outcomes: list[tuple[Sequence, int, FinishReason | None]]) -> None:
        for seq, _, _ in outcomes:
            if seq.forks and seq.status is Status.PREFILLING:
                fork_kv(self.pool, seq)  # its choices sampled their first tokens too
        for seq, token, reason in outcomes:
            if reason is not None:
                self.finish(seq, reason)
            elif seq.status is Status.PREFILLING:
                if self._mode == DisaggregationMode.PREFILL:
                    self._apply(self.disagg.after_prefill(seq, token))
                else:
                    seq.status = Status.RUNNING
                    self.running.append(seq)

    def poll_peer(self, timeout_s: float) -> None:
        """Disaggregated: let the KV transport progress; apply what it reports."""
        self._apply(self.disagg.poll(timeout_s))

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Adopt):
                self._adopt(action)
            elif isinstance(action, Complete):
                self.processor.add_prefill_token(action.seq, action.first_token)
                self.finish(action.seq, finish_length(0))  # SGLang's prefill-side chunk
            elif isinstance(action, Fail):
                self.finish(action.seq, finish_abort(action.message, action.status_code))
            elif isinstance(action, Free):
                self._release(action.pages)

    def _adopt(self, action: Adopt) -> None:
        """Decode: the prompt's KV is in the leader's pages; it and each choice still waiting
        (n > 1, forked off it now) continue from their own first token."""
        firsts = [(action.first_token, action.logprob), *action.choices]
        for seq in adopt_group(self.pool, action.seq):
            seq.status, seq.prefilled = Status.RUNNING, seq.prompt_len
            self.running.append(seq)
            token, logprob = firsts[seq.index or 0]
            reason = self.processor.adopt_first_token(seq, token, logprob)
            if reason is not None:
                self.finish(seq, reason)

    # ---- finish -----------------------------------------------------------------------------
    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a request for any reason: free its pages, leave every queue, send the last chunk."""
        if seq.finished:
            return
        self.processor.finalize(seq, reason)
        prev, seq.status = seq.status, Status.FINISHED
        for fork in pending(seq):  # n > 1: choices waiting for a prompt that will not come
            self.finish(fork, reason)
        if self.disagg is not None and self.disagg.on_finish(seq, prev):
            seq.pages = None  # a peer may still touch them: the coordinator frees them later
        if seq.pages is not None:
            self._release(self._keep_prefix(seq, reason))
            seq.pages = None
        self.live.pop(seq.rid, None)
        if prev is Status.WAITING:
            self._stalled = False  # a new queue head may fit
            if seq in self.waiting:
                self.waiting.remove(seq)
        elif prev is Status.RUNNING:
            self.running.remove(seq)
        if self._chunked is seq:
            self._chunked = None
        self.processor.send_final(seq)

    def _keep_prefix(self, seq: Sequence, reason: FinishReason) -> PageRun | None:
        """The prefix cache keeps the whole pages of a request that ran to its end; -> the
        pages to free."""
        if self.cache is None or reason["type"] == "abort" or seq.prefilled < seq.prompt_len:
            return seq.pages
        return self.cache.insert((seq.input_ids + seq.output_ids)[:seq.kv_len], seq.pages)

    def _release(self, pages: PageRun | None) -> None:
        if pages is not None:
            self.pool.free(pages)
        self._stalled = False

    def close(self) -> None:
        """Engine shutdown: every request ends; the transport lets go of the pages it held."""
        self.abort_everything("The engine was shut down", 503)
        if self.disagg is not None:
            self._apply(self.disagg.close())
