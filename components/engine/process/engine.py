"""``CpuEngine``: SGLang's offline Engine API on the embedded CPU engine.

The asyncio side only validates cheap things, enqueues the request for the engine thread and
awaits chunks from a per-request asyncio queue. It works from any event loop (the loop is
captured per call). Streams are incremental, as with SGLang's ``incremental_streaming_output``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from transformers import AutoTokenizer

from components.engine.process.attached import AttachedCpuEngine
from components.engine.config import EngineConfig
from components.engine.core.loop import EngineLoop
from components.engine.disagg.coordinator import DisaggCoordinator
from components.engine.api.requests import checked_rid, choice_rows, make_sequence
from components.engine.process.service import EngineService
from components.engine.api.streams import final_chunk, stream_chunks
from components.engine.api.readouts import EngineReadouts
from components.engine.api.totals import RequestTotals
from components.engine.api.sync import SyncGenerateMixin
from components.engine.core.forks import make_choices
from components.engine.output.grammar import GrammarBackend, grammar_of
from components.engine.kv.events import KvEventListener
from components.engine.core.loop_batcher import LoopBatcher
from components.engine.core.sequence import Sequence
from components.engine.api.tokenizer_manager import CpuTokenizerManager

logger = logging.getLogger(__name__)

SHUTDOWN_JOIN_S = 30.0

class CpuEngine(EngineReadouts, SyncGenerateMixin):
    """``CpuEngine(**kwargs)`` with SGLang ServerArgs names (see EngineConfig)."""

    def __init__(self, server_args: EngineConfig | None = None, **kwargs: Any) -> None:
        if server_args is None:
            server_args = EngineConfig.from_kwargs(**kwargs)
        self.server_args = cfg = server_args
        tokenizer = None
        if not cfg.skip_tokenizer_init:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        self._batcher = LoopBatcher()
        self._loop = EngineLoop(cfg, self._batcher, DisaggCoordinator)
        self._info = self._loop.start()
        if self._info.bootstrap_port not in (None, cfg.disaggregation_bootstrap_port):
            # Port 0 asked for a free port: report the bound one, as callers read it from here.
            self.server_args = dataclasses.replace(
                cfg, disaggregation_bootstrap_port=self._info.bootstrap_port)
        self._lock = threading.Lock()
        self._live_rids: set[str] = set()
        self._totals = RequestTotals()
        self._closed = False
        self._grammars = GrammarBackend(
            cfg.model_path, self._info.vocab_size, self._info.eos_token_ids,
            any_whitespace=not cfg.constrained_json_disable_any_whitespace,
            max_whitespace_cnt=cfg.constrained_json_max_whitespace_cnt)
        self.tokenizer_manager = CpuTokenizerManager(tokenizer, self.server_args, self._loop)
        self._service: EngineService | None = None
        if cfg.tokenizer_worker_num > 1:
            self._service = EngineService(self)
            self._service.start()

    @classmethod
    def attach_tokenizer_worker(cls, parent_pid: int | None = None) -> AttachedCpuEngine:
        """SGLang's ``Engine.attach_tokenizer_worker``: the Engine API in this process, run by
        the engine of ``parent_pid`` (default: the parent process), which was started with
        ``tokenizer_worker_num > 1``."""
        return AttachedCpuEngine(os.getppid() if parent_pid is None else parent_pid)

    def set_kv_event_listener(self, listener: KvEventListener) -> None:
        """Report cached blocks and load to ``listener``, called on the engine thread
        (``components/engine/kv/events.py``); the cache's earlier blocks are not replayed."""
        self._loop.set_kv_event_listener(listener)

    # ---- generation ---------------------------------------------------------------------------
    async def async_generate(
        self,
        prompt: str | None = None,
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        image_data: Any = None,
        audio_data: Any = None,
        video_data: Any = None,
        mm_hashes: Any = None,
        mm_content_hashes: Any = None,
        return_logprob: bool = False,
        logprob_start_len: Any = None,
        top_logprobs_num: Any = None,
        token_ids_logprob: Any = None,
        lora_path: Any = None,
        custom_logit_processor: Any = None,
        require_reasoning: bool = False,
        return_hidden_states: bool = False,
        return_routed_experts: bool = False,
        routed_experts_start_len: int = 0,
        stream: bool = False,
        bootstrap_host: str | None = None,
        bootstrap_port: int | None = None,
        bootstrap_room: int | None = None,
        routed_dp_rank: int | None = None,
        disagg_prefill_dp_rank: int | None = None,
        kv_hints: dict | None = None,
        data_parallel_rank: int | None = None,
        external_trace_header: dict | None = None,
        rid: str | None = None,
        session_params: dict | None = None,
        priority: int | None = None,
        session_id: str | None = None,
        *,
        cache_salt: Any = None,
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """One request. ``stream=True``: an async iterator of incremental chunks, sent on its
        first read; else the final dict (cumulative ``output_ids``/``text``). A request refused
        before it runs raises ValueError with the reason (``engine_streams.py``); unsupported
        features and batches raise ValueError at the call."""
        given = locals()
        rid = checked_rid(given, self.server_args)
        seq = make_sequence(rid, given, self.server_args, self._info.vocab_size)
        mode = self.server_args.disaggregation_mode
        n = choice_rows(seq.params.n, mode) if seq.reject is None else 1
        group = make_choices(seq, n) if n > 1 else [seq]
        loop = asyncio.get_running_loop()

        async def start() -> asyncio.Queue:
            if seq.reject is not None:
                raise ValueError(seq.reject)
            grammar = grammar_of(seq.params)
            if grammar is not None:  # compiled once (cached); a matcher for every choice
                for row in group:
                    row.grammar = await self._grammars.request_grammar(*grammar)
            queue: asyncio.Queue = asyncio.Queue()
            for row in group:
                row.sink = self._sink_for(loop, queue, row.rid, row.index)
            self._submit(group)
            return queue

        def abort() -> None:  # with n > 1 the caller's rid names every choice
            self.tokenizer_manager.abort_request(rid)

        if stream:
            return stream_chunks(start, abort, n)
        return await final_chunk(start, abort, n)

    def _sink_for(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, rid: str,
                  index: int | None):
        batcher, live, lock, totals = self._batcher, self._live_rids, self._lock, self._totals

        def sink(chunk: dict[str, Any], final: bool) -> None:  # runs on the engine thread
            if index is not None:  # n > 1: which choice, as SGLang tags it
                chunk["index"] = index
            if final:
                with lock:
                    live.discard(rid)
                totals.record(chunk.get("meta_info") or {})
            batcher.put(loop, queue, chunk)

        return sink

    def _submit(self, group: list[Sequence]) -> None:
        """One request: its first Sequence, carrying the other choices when n > 1."""
        with self._lock:
            if self._closed or not self._loop.alive:
                raise RuntimeError("the CPU engine is shut down")
            for seq in group:
                if seq.rid in self._live_rids:
                    raise ValueError(f"Duplicate request ID detected: {seq.rid}")
            self._live_rids.update(seq.rid for seq in group)
            self._loop.submit(group[0])

    # ---- lifecycle ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the engine thread (idempotent): live requests end with an abort, memory is freed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._service is not None:
            self._service.stop()
        self._grammars.shutdown()
        self._loop.stop(SHUTDOWN_JOIN_S)

    def __enter__(self) -> "CpuEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

