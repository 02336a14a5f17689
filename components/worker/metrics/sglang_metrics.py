"""SGLang's own metric names (`sglang:*`, SGLang 0.5.23's `srt/observability/metrics_collector.py`)
on the worker's `/metrics`, as Dynamo 1.6.1's SGLang worker shows them, on both engines:

- `--engine sglang --enable-metrics`: SGLang's metrics themselves (`SglangPassthrough`). SGLang's
  schedulers write them to its multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`, which SGLang
  sets when it starts with metrics on), read with `prometheus_client`'s MultiProcessCollector as
  1.6.1 does (`dynamo.sglang.publisher.setup_prometheus_registry`). SGLang's tokenizer-side
  metrics (TTFT, ITL, token counts) live in this process; `prometheus_client` was imported here
  before SGLang set the directory, so they stay in this process's default registry, read from
  there.
- the CPU engine: the subset that means the same on it, with SGLang's names, types, label names
  and buckets: scheduler gauges and token counters read from the engine at scrape time
  (`CpuSglangCollector`), request histograms observed at the endpoint (`SglangRequestHistograms`,
  fed by components/worker/metrics/worker_metrics.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

logger = logging.getLogger(__name__)

SGLANG_PREFIX = "sglang:"
# SGLang's default buckets (TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
               8.000)
# The worker always asks its engine for a stream (SGLang labels its requests so in 1.6.1 too).
STREAMING = "true"


def engine_type(role: Any) -> str:
    """SGLang's `engine_type` label (DisaggregationMode.to_engine_type)."""
    return "prefill" if role.prefill else "unified" if role.aggregated else "decode"


def tokenizer_labels(model_name: str, kind: str) -> dict[str, str]:
    """The labels of SGLang's tokenizer-side metrics (`tokenizer_metric_labels`)."""
    return {"model_name": model_name, "engine_type": kind}


def scheduler_labels(model_name: str, kind: str) -> dict[str, str]:
    """The labels of SGLang's scheduler metrics: one scheduler, rank 0 of each parallelism."""
    return {**tokenizer_labels(model_name, kind), "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0"}


class SglangRequestHistograms:
    """`sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds` (one
    observation per token, as SGLang's) and `sglang:e2e_request_latency_seconds`."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        names = list(labels)
        self.ttft = Histogram("sglang:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              [*names, "is_streaming"], buckets=TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("sglang:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", names,
                             buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds",
                             [*names, "is_streaming"], buckets=E2E_BUCKETS, registry=registry)

        # The label values are fixed per worker: resolve each child once, not per token.
        self._ttft = self.ttft.labels(**labels, is_streaming=STREAMING)
        self._itl = self.itl.labels(**labels)
        self._e2e = self.e2e.labels(**labels, is_streaming=STREAMING)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_itl(self, seconds_per_token: float, tokens: int) -> None:
        observe = self._itl.observe
        for _ in range(tokens):
            observe(seconds_per_token)

    def observe_e2e(self, seconds: float) -> None:
        self._e2e.observe(seconds)


class CpuSglangCollector:
    """SGLang's scheduler gauges and tokenizer counters from the CPU engine's read-outs, taken at
    scrape time. `num_used_tokens` counts pages held by requests (not the prefix cache), as
    SGLang's excludes its evictable radix cache; `cache_hit_rate` is cumulative since start
    (SGLang's covers its last logged prefill batches)."""

    def __init__(self, engine: Any, model_name: str, kind: str) -> None:
        self._engine = engine
        self._sched = scheduler_labels(model_name, kind)
        self._tok = tokenizer_labels(model_name, kind)

    def describe(self) -> list[Metric]:
        return []  # the engine decides what it can read out

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        if callable(getattr(engine, "kv_pages_total", None)):
            page, total = int(engine.page_size), engine.kv_pages_total()
            running = max(0, engine.requests_in_flight() - engine.queue_depth())
            used = engine.kv_pages_in_use() * page
            yield self._gauge("num_running_reqs", "The number of running requests.", running)
            yield self._gauge("num_queue_reqs", "The number of requests in the waiting queue.",
                              engine.queue_depth())
            yield self._gauge("num_used_tokens", "The number of used tokens.", used)
            yield self._gauge("token_usage", "The token usage.",
                              used / (total * page) if total else 0.0)
        totals_of = getattr(engine, "request_totals", None)
        if callable(totals_of):
            t = totals_of()
            yield self._gauge("cache_hit_rate", "The prefix cache hit rate.",
                              t.hit_rate)
            streaming = {**self._tok, "is_streaming": STREAMING}
            yield self._counter("prompt_tokens", "Number of prefill tokens processed.",
                                t.prompt_tokens, streaming)
            yield self._counter("generation_tokens", "Number of generation tokens processed.",
                                t.generation_tokens, streaming)
            yield self._counter("num_requests", "Number of requests processed.", t.requests,
                                streaming)
            yield self._counter("cached_tokens", "Number of cached prompt tokens by source "
                                "(device/host/storage).", t.cached_tokens,
                                {**self._tok, "cache_source": "device"})

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(SGLANG_PREFIX + name, doc, labels=list(self._sched))
        family.add_metric(list(self._sched.values()), value)
        return family

    def _counter(self, name: str, doc: str, value: float,
                 labels: dict[str, str]) -> CounterMetricFamily:
        family = CounterMetricFamily(SGLANG_PREFIX + name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), value)
        return family


class SglangPassthrough:
    """`--engine sglang --enable-metrics`: every `sglang:*` family SGLang writes, from its
    multiprocess directory (scheduler processes) and this process's default registry (its
    tokenizer). A family in both keeps the directory's. `multiprocess` is False in a
    `--tokenizer-worker-num` attached process: the engine process's page shows the schedulers."""

    def __init__(self, multiprocess: bool = True) -> None:
        self._dir = CollectorRegistry(auto_describe=False)
        if multiprocess and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess as mp

            try:
                mp.MultiProcessCollector(self._dir)
            except ValueError as exc:  # the variable names no directory: serve without them
                logger.warning("SGLang's multiprocess metrics are unreadable: %s", exc)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        try:
            families = list(self._dir.collect())
        except (OSError, ValueError) as exc:  # a file being written or removed mid-scrape
            logger.warning("reading SGLang's multiprocess metrics failed: %s", exc)
            families = []
        for family in [*families, *REGISTRY.collect()]:
            if family.name.startswith(SGLANG_PREFIX) and family.name not in seen:
                seen.add(family.name)
                yield family
