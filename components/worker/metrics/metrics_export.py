"""What the worker puts on Dynamo's `/metrics` (the system port), next to the runtime's own
`dynamo_component_*` request metrics, through Dynamo's `register_engine_metrics_callback` as
Dynamo 1.6.1's SGLang worker does (docs/reference/metrics.md):

- the worker's registry (components/worker/metrics/worker_metrics.py) with SGLang's `sglang:*`
  families (components/worker/metrics/sglang_metrics.py), labelled with the worker's
  `dynamo_namespace`, `dynamo_component`, `dynamo_endpoint`, `worker_id`, `model` and `model_name`;
- Dynamo's standard engine gauges (components/worker/metrics/component_gauges.py) in a registry of
  their own, without those labels, as 1.6.1 registers them.
"""

from __future__ import annotations

from typing import Any, Optional

from prometheus_client import CollectorRegistry

from dynamo.common.utils.prometheus import register_engine_metrics_callback

from components.worker.metrics.component_gauges import ComponentGauges
from components.worker.flags.config import WorkerConfig
from components.worker.metrics.worker_metrics import WorkerMetrics
from components.worker.metrics.sglang_metrics import (CpuSglangCollector, SglangPassthrough,
                                              SglangRequestHistograms, engine_type,
                                              tokenizer_labels)
from components.worker.lifecycle.tokenizer_workers import engine_pid


def add_sglang_metrics(metrics: WorkerMetrics, config: WorkerConfig, engine: Any,
                       owns_engine: bool) -> None:
    """SGLang's own (`--engine sglang --enable-metrics`), or the CPU engine's subset."""
    if config.backend.own_sglang_metrics:
        metrics.registry.register(SglangPassthrough(multiprocess=owns_engine))
        return
    kind = engine_type(config.role)
    metrics.registry.register(CpuSglangCollector(engine, config.served_model_name, kind))
    metrics.sglang = SglangRequestHistograms(metrics.registry,
                                             tokenizer_labels(config.served_model_name, kind))


def expose_metrics(endpoint: Any, config: WorkerConfig, engine: Any, metrics: WorkerMetrics,
                   load_seconds: Optional[float] = None) -> None:
    namespace, component, name = config.dynamo.endpoint.split(".")
    owns_engine = engine_pid() is None  # not a --tokenizer-worker-num attached process
    add_sglang_metrics(metrics, config, engine, owns_engine)
    register_engine_metrics_callback(
        endpoint, metrics.registry, namespace_name=namespace, component_name=component,
        endpoint_name=name, model_name=config.served_model_name)
    if owns_engine:
        gauges = CollectorRegistry(auto_describe=False)
        page_size = config.backend.limits(engine).page_size
        gauges.register(ComponentGauges(config.backend, engine, page_size,
                                        config.served_model_name, component, load_seconds))
        register_engine_metrics_callback(endpoint, gauges)
