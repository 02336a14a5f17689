"""The engine's parts, built from its config on the engine thread (docs/reference/cpu-engine.md,
"The CPU engine's core"): the model runner, the KV pool sized for it, the output processor, the
disaggregation coordinator, the prefix cache and the scheduler over them, and `EngineInfo`,
what other threads may read about the result."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoTokenizer

from components.engine.config import DisaggregationMode, EngineConfig
from components.engine.core.actions import Coordinator, MakeCoordinator
from components.engine.kv.pool import KVPool
from components.engine.model.facts import context_length, eos_token_ids, read_model_shape
from components.engine.core.runner import TORCH_DTYPES, ModelRunner
from components.engine.core.processor import OutputProcessor
from components.engine.kv.prefix_cache import PrefixCache
from components.engine.core.request_checks import Limits
from components.engine.core.scheduler import Scheduler, SchedulerConfig


@dataclass(frozen=True)
class EngineInfo:
    """What the engine thread found at startup; read-only for other threads."""

    vocab_size: int
    context_length: int
    num_pages: int
    page_size: int
    max_total_num_tokens: int
    eos_token_ids: frozenset[int]
    bootstrap_port: int | None  # prefill mode: the port the bootstrap server really bound


@dataclass(frozen=True)
class EngineParts:
    """What the engine thread holds: its step drives the scheduler, the runner and the
    processor as peers; the pool, the cache and the coordinator serve other threads' read-outs."""

    info: EngineInfo
    pool: KVPool
    runner: ModelRunner
    processor: OutputProcessor
    sched: Scheduler
    cache: PrefixCache | None  # None: --disable-radix-cache, or a decode engine
    disagg: Coordinator | None  # None: not disaggregated


def build_parts(cfg: EngineConfig, make_coordinator: MakeCoordinator) -> EngineParts:
    """Call on the engine thread only: the model load is torch work, and libgomp throttles a
    process whose torch ops have run on more than one OS thread."""
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.random_seed)
    shape = read_model_shape(cfg.model_path)
    context = context_length(cfg.context_length, shape.max_position_embeddings)
    dtype = TORCH_DTYPES[cfg.dtype]
    token_bytes = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * dtype.itemsize
    pool = KVPool(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                  cfg.num_pages(token_bytes), cfg.page_size, dtype)
    runner = ModelRunner(cfg.model_path, cfg.dtype, pool)
    tokenizer = None
    if not cfg.skip_tokenizer_init:  # the engine thread's own copy (never shared)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
    eos = eos_token_ids(cfg.model_path, runner.model.config, tokenizer)
    mode = cfg.disaggregation_mode
    processor = OutputProcessor(tokenizer, eos, runner.vocab_size, cfg.stream_interval,
                                cfg.random_seed, mode == DisaggregationMode.PREFILL)
    disagg = None
    if mode != DisaggregationMode.NULL:
        disagg = make_coordinator(cfg, pool, runner.vocab_size)
    sched_cfg = SchedulerConfig(cfg.max_running_requests, cfg.max_prefill_tokens,
                                cfg.chunked_prefill_size, cfg.enable_mixed_chunk)
    limits = Limits(runner.vocab_size, context, pool.num_tokens, mode)
    # As SGLang: a decode engine has a prefix cache only with its own flag, which wins over
    # --disable-radix-cache (SGLang's PD hook sets disable_radix_cache=False for it).
    wants_cache = (cfg.disaggregation_decode_enable_radix_cache
                   if mode == DisaggregationMode.DECODE else not cfg.disable_radix_cache)
    cache = PrefixCache(pool) if wants_cache else None
    sched = Scheduler(sched_cfg, limits, pool, processor, tokenizer, disagg, cache)
    port = disagg.bootstrap_port if disagg is not None else None
    info = EngineInfo(runner.vocab_size, context, pool.num_pages, cfg.page_size,
                      pool.num_tokens, eos, port)
    return EngineParts(info, pool, runner, processor, sched, cache, disagg)
