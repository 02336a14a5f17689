"""Dynamo 1.6.1's standard engine gauges (`dynamo.common.utils.prometheus.LLMBackendMetrics`),
with its names, help, types and labels, on both engines:

- `dynamo_component_total_blocks{model, dynamo_component, dp_rank}`: KV blocks in the pool;
- `dynamo_component_gpu_cache_usage_percent{...}`: share of the pool in use, 0.0-1.0;
- `dynamo_component_kv_cache_hit_rate{...}`: prefix-cache hit rate, 0.0-1.0 (1.6.1's SGLang
  worker leaves it unset; here it is SGLang's own `cache_hit_rate`, or the CPU engine's);
- `dynamo_component_model_load_time_seconds{model, dynamo_component}`: engine start-up.

1.6.1 sets them when its scheduler metrics arrive; here they are read from the engine when
`/metrics` is scraped (`EngineBackend.kv_load`). As in 1.6.1 they sit in their own registry,
registered without Dynamo's hierarchy labels, and only the process that owns the engine reports
them (not a `--tokenizer-worker-num` attached process).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

from prometheus_client.core import GaugeMetricFamily, Metric

from dynamo.prometheus_names import kvstats, labels, model_info, name_prefix

TOTAL_BLOCKS = f"{name_prefix.COMPONENT}_{kvstats.TOTAL_BLOCKS}"
CACHE_USAGE = f"{name_prefix.COMPONENT}_{kvstats.GPU_CACHE_USAGE_PERCENT}"
HIT_RATE = f"{name_prefix.COMPONENT}_{kvstats.KV_CACHE_HIT_RATE}"
LOAD_TIME = f"{name_prefix.COMPONENT}_{model_info.LOAD_TIME_SECONDS}"
RANK_LABELS = [labels.MODEL, labels.COMPONENT, labels.DP_RANK]


class ComponentGauges:
    def __init__(self, backend: Any, engine: Any, page_size: int, model: str, component: str,
                 load_seconds: Optional[float] = None) -> None:
        self._read = lambda: backend.kv_load(engine, page_size)
        self._model, self._component = model, component
        self.load_seconds = load_seconds

    def describe(self) -> list[Metric]:
        return []  # the ranks come from the engine

    def collect(self) -> Iterator[Metric]:
        loads = self._read() or []
        total = GaugeMetricFamily(TOTAL_BLOCKS,
                                  "Total number of KV cache blocks available on the worker.",
                                  labels=RANK_LABELS)
        usage = GaugeMetricFamily(CACHE_USAGE, "GPU cache usage as a percentage (0.0-1.0).",
                                  labels=RANK_LABELS)
        hit = GaugeMetricFamily(HIT_RATE,
                                "Prefix cache hit rate (0.0-1.0). Portable across engines.",
                                labels=RANK_LABELS)
        for load in loads:
            values = [self._model, self._component, str(load.dp_rank)]
            total.add_metric(values, load.total_blocks)
            usage.add_metric(values, load.usage)
            hit.add_metric(values, load.hit_rate)
        if loads:
            yield from (total, usage, hit)
        if self.load_seconds is not None:
            load_time = GaugeMetricFamily(LOAD_TIME, "Model load time in seconds.",
                                          labels=[labels.MODEL, labels.COMPONENT])
            load_time.add_metric([self._model, self._component], self.load_seconds)
            yield load_time
