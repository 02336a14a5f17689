"""Checks shared by the e2e metric tests of both engines: the names Dynamo 1.6.1 + SGLang users
chart (SGLang's `sglang:*`, Dynamo's standard engine gauges) on a worker's `/metrics`, with
their labels (docs/reference/metrics.md)."""

from __future__ import annotations

from harness.worker_metrics import series

# Dynamo's labels on the worker's registry (register_engine_metrics_callback's auto-labels).
HIERARCHY = ("dynamo_namespace", "dynamo_component", "dynamo_endpoint", "worker_id", "model")
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
SGLANG_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                 "sglang:token_usage", "sglang:cache_hit_rate")
KV_GAUGES = ("dynamo_component_total_blocks", "dynamo_component_gpu_cache_usage_percent",
             "dynamo_component_kv_cache_hit_rate")


def one(port: int, name: str) -> dict:
    found = series(port, name)
    assert len(found) == 1, (name, found)
    return found[0]


def check_sglang_gauges(port: int, model: str, engine_type: str) -> None:
    for name in SGLANG_GAUGES:
        s = one(port, name)
        assert set(SCHEDULER_LABELS + HIERARCHY) <= set(s), (name, s)
        assert (s["model_name"], s["engine_type"], s["model"]) == (model, engine_type, model)
        assert s["value"] >= 0
    assert 0 <= one(port, "sglang:token_usage")["value"] <= 1
    assert 0 <= one(port, "sglang:cache_hit_rate")["value"] <= 1


def check_component_gauges(port: int, model: str, component: str) -> dict[str, float]:
    """Dynamo 1.6.1's labels exactly (its own registry: no hierarchy labels); the values."""
    values = {}
    for name in KV_GAUGES:
        s = one(port, name)
        assert {k: v for k, v in s.items() if k != "value"} == {
            "model": model, "dynamo_component": component, "dp_rank": "0"}, (name, s)
        values[name] = s["value"]
    load = one(port, "dynamo_component_model_load_time_seconds")
    assert (load["model"], load["dynamo_component"]) == (model, component)
    values["dynamo_component_model_load_time_seconds"] = load["value"]
    assert values["dynamo_component_total_blocks"] > 0
    assert 0 <= values["dynamo_component_gpu_cache_usage_percent"] <= 1
    assert 0 <= values["dynamo_component_kv_cache_hit_rate"] <= 1
    assert 0 < values["dynamo_component_model_load_time_seconds"] < 600
    return values
