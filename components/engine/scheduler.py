"""Continuous batching on the engine thread: each step admits and prefills new requests, then
decodes every running row in one batched forward. Rows join and leave between steps.

Shaped like nano-vllm: ``step()`` = schedule, run, postprocess.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.engine import outputs
from components.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from components.engine.kv_pool import KVPool
from components.engine.model_runner import ModelRunner
from components.engine.request_checks import (
    Limits, RequestError, check_bootstrap, check_input_ids, plan_budget, tokenize_prompt,
)
from components.engine.sampling import SamplingState, make_generator, sample
from components.engine.sequence import Sequence, Status

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int
    max_prefill_tokens: int
    stream_interval: int
    random_seed: int


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        limits: Limits,
        runner: ModelRunner,
        pool: KVPool,
        tokenizer: Any,
        eos_ids: frozenset[int],
    ) -> None:
        self.cfg = cfg
        self.limits = limits
        self.runner = runner
        self.pool = pool
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.live: dict[str, Sequence] = {}
        self._seeds = random.Random(cfg.random_seed)
        self._stalled = False  # the queue head does not fit in the pool until pages are freed
        self.disagg = None  # set by the engine loop in prefill/decode mode (DisaggCoordinator)
        self.flush: Callable[[], None] = lambda: None  # set by the engine loop: send chunks now

    # ---- requests in and out ----------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.live[seq.rid] = seq
        try:
            if seq.reject is not None:
                raise RequestError(seq.reject)
            tokenize_prompt(seq, self.tokenizer)
            seq.input_ids = check_input_ids(seq.input_ids, self.limits)
            check_bootstrap(seq, self.limits)
            seq.reserve_tokens = plan_budget(seq, self.limits)
            if self.disagg is not None:
                self.disagg.check_new(seq)
        except RequestError as exc:
            self.finish(seq, outputs.finish_abort(str(exc), 400))
            return
        self._init_sampling(seq)
        self.waiting.append(seq)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        if abort_all:
            targets = list(self.live.values())
        else:
            targets = [self.live[rid]] if rid in self.live else []
        for seq in targets:
            logger.info("abort rid=%s (%s)", seq.rid, seq.status.value)
            self.finish(seq, outputs.finish_abort("Aborted"))

    def abort_everything(self, message: str, status_code: int | None) -> None:
        for seq in list(self.live.values()):
            self.finish(seq, outputs.finish_abort(message, status_code))

    def has_compute_work(self) -> bool:
        return bool(self.running) or (self._admissible() and not self._stalled)

    def release_pages(self, pages) -> None:
        self.pool.free(pages)
        self._stalled = False

    def _admissible(self) -> bool:
        return bool(self.waiting) and self._active() < self.cfg.max_running_requests

    def _active(self) -> int:
        return len(self.live) - len(self.waiting)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> None:
        self._admit()
        self.flush()  # new requests' first tokens go out now, not after the next decode forward
        if self.running:
            self._decode()

    def _admit(self) -> None:
        prefilled = 0
        while self._admissible():
            seq = self.waiting[0]
            over_budget = prefilled + seq.prompt_len > self.cfg.max_prefill_tokens
            if prefilled and over_budget:  # decode mode never prefills, so never stops here
                return
            if seq.max_new_tokens == 0 and self.limits.disaggregation_mode == "null":
                self.waiting.popleft()
                self.finish(seq, outputs.finish_length(0))
                continue
            pages = self.pool.allocate(seq.reserve_tokens)
            if pages is None:
                self._stalled = True  # FIFO: wait until a finishing request frees pages
                return
            self.waiting.popleft()
            seq.attach_pages(pages, self.pool.page_size)
            if self.limits.disaggregation_mode == "decode":
                self.disagg.start_decode(seq)
                continue
            prefilled += seq.prompt_len
            t0 = time.perf_counter()
            logits = self.runner.prefill(seq.input_ids, seq.start_tok)
            token = sample(logits.unsqueeze(0), [seq.sampling])[0]
            logger.debug("prefill rid=%s %d tokens in %.1f ms", seq.rid, seq.prompt_len,
                         (time.perf_counter() - t0) * 1e3)
            if self.limits.disaggregation_mode == "prefill":
                self.disagg.start_prefill(seq, token)
            else:
                seq.status = Status.RUNNING
                self.running.append(seq)
                self.on_token(seq, token)

    def _decode(self) -> None:
        rows = list(self.running)  # finish() removes rows from self.running
        logits = self.runner.decode(
            [s.output_ids[-1] for s in rows], [s.start_tok for s in rows], [s.kv_len for s in rows]
        )
        tokens = sample(logits, [s.sampling for s in rows])
        for seq, token in zip(rows, tokens):
            self.on_token(seq, token)

    # ---- postprocess ------------------------------------------------------------------------
    def on_token(self, seq: Sequence, token: int) -> None:
        """Append one generated token, check the finish conditions, stream what is due."""
        seq.output_ids.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        p = seq.params
        reason = None
        if not p.ignore_eos and (token in self.eos_ids or token in p.stop_token_ids):
            reason = outputs.finish_stop_token(token)
        if seq.detok is not None and (reason is None or p.no_stop_trim):
            emit, matched = seq.stops.push(seq.detok.add(token))
            seq.unsent_text += emit
            if matched is not None:
                reason = outputs.finish_stop_str(matched)
        if reason is None and len(seq.output_ids) >= seq.max_new_tokens:
            reason = outputs.finish_length(seq.max_new_tokens)
        if reason is not None:
            self.finish(seq, reason)
        else:
            self._emit(seq)

    def finish(self, seq: Sequence, reason: dict[str, Any]) -> None:
        """End a request for any reason: free its pages, leave every queue, send the last chunk."""
        if seq.finished:
            return
        if seq.detok is not None and reason["type"] != "abort" and not _is_stop_str(reason):
            seq.unsent_text += seq.stops.push(seq.detok.flush())[0] + seq.stops.flush()
        seq.finish_reason = reason
        prev, seq.status = seq.status, Status.FINISHED
        if self.disagg is not None:
            self.disagg.forget(seq, prev)  # may keep the pages until an in-flight WRITE drained
        if seq.pages is not None:
            self.release_pages(seq.pages)
            seq.pages = None
        self.live.pop(seq.rid, None)
        if prev is Status.WAITING:
            self._stalled = False  # a new queue head may fit
            if seq in self.waiting:
                self.waiting.remove(seq)
        elif prev is Status.RUNNING:
            self.running.remove(seq)
        self._emit(seq)
        ttft_ms = (seq.first_token_at - seq.created_at) * 1e3 if seq.first_token_at else -1.0
        logger.info("finish rid=%s reason=%s prompt=%d completion=%d ttft=%.1fms", seq.rid,
                    reason["type"], seq.prompt_len, len(seq.output_ids), ttft_ms)

    def _emit(self, seq: Sequence) -> None:
        final = seq.finished
        unsent = len(seq.output_ids) - seq.num_sent_ids
        if not final:
            if not seq.stream:
                return
            interval = seq.params.stream_interval or self.cfg.stream_interval
            if seq.num_sent_ids > 0 and unsent < interval:
                return
        ids = seq.output_ids[seq.num_sent_ids:]
        text, seq.unsent_text = seq.unsent_text, ""
        seq.num_sent_ids = len(seq.output_ids)
        seq.sink(outputs.build_chunk(seq, self.tokenizer is not None, ids, text), final)

    # ---- helpers ----------------------------------------------------------------------------
    def _init_sampling(self, seq: Sequence) -> None:
        p = seq.params
        stop_ids = () if p.ignore_eos else tuple(self.eos_ids | p.stop_token_ids)
        seq.sampling = SamplingState(p, make_generator(p, self._seeds.getrandbits(63)),
                                     stop_ids, seq.output_ids)
        if self.tokenizer is not None:
            seq.detok = IncrementalDetokenizer(self.tokenizer, seq.input_ids, p.skip_special_tokens,
                                               p.spaces_between_special_tokens)
            seq.stops = StopStringMatcher(p.stop, p.no_stop_trim)


def _is_stop_str(reason: dict[str, Any]) -> bool:
    return reason["type"] == "stop" and isinstance(reason.get("matched"), str)
