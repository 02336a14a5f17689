"""SGLang's `sglang:*` names and Dynamo's standard engine gauges without a runtime
(components/worker/metrics/sglang_metrics.py, component_gauges.py): names, types and labels as
SGLang 0.5.23 and Dynamo 1.6.1 declare them, values from a fake engine read-out, and SGLang's
multiprocess directory passed through."""

import asyncio
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from components.backends.cpu import CpuBackend
from components.backends.load import KvLoad
from components.backends.sglang import SglangBackend
from components.engine.api.totals import Totals
from components.worker.lifecycle.endpoint import endpoint
from components.worker.metrics.component_gauges import ComponentGauges
from components.worker.metrics.worker_metrics import WorkerMetrics
from components.worker.metrics.sglang_metrics import (CpuSglangCollector, SglangPassthrough,
                                              SglangRequestHistograms, tokenizer_labels)

SCHED = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
         "moe_ep_rank": "0"}


class FakeCpuEngine:
    page_size = 16

    def kv_pages_total(self):
        return 100

    def kv_pages_in_use(self):
        return 25

    def queue_depth(self):
        return 2

    def requests_in_flight(self):
        return 5

    def request_totals(self):
        return Totals(requests=4, prompt_tokens=1000, generation_tokens=40, cached_tokens=250)


def families(*collectors) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def only(family):
    [sample] = family.samples
    return sample


def sglang_declared_names() -> set[str]:
    """Every `name="sglang:..."` in SGLang's metrics collector (read, not imported)."""
    spec = importlib.util.find_spec("sglang")
    source = Path(spec.origin).parent / "srt/observability/metrics_collector.py"
    return set(re.findall(r'name="(sglang:\w+)"', source.read_text()))


def test_cpu_gauges_and_counters_have_sglangs_names_labels_and_values():
    got = families(CpuSglangCollector(FakeCpuEngine(), "m", "unified"))
    gauges = {"sglang:num_running_reqs": 3, "sglang:num_queue_reqs": 2,
              "sglang:num_used_tokens": 400, "sglang:token_usage": 0.25,
              "sglang:cache_hit_rate": 0.25}
    for name, value in gauges.items():
        assert got[name].type == "gauge"
        assert only(got[name]).labels == SCHED and only(got[name]).value == value, name
    tok = {"model_name": "m", "engine_type": "unified"}
    counters = {"sglang:prompt_tokens": 1000, "sglang:generation_tokens": 40,
                "sglang:num_requests": 4}
    for name, value in counters.items():
        assert got[name].type == "counter"
        assert only(got[name]).labels == {**tok, "is_streaming": "true"}
        assert only(got[name]).value == value
    cached = only(got["sglang:cached_tokens"])
    assert cached.labels == {**tok, "cache_source": "device"} and cached.value == 250
    declared = sglang_declared_names()
    assert {n if n in gauges else n + "_total" for n in got} <= declared


def test_engines_without_read_outs_add_no_sglang_families():
    assert families(CpuSglangCollector(SimpleNamespace(), "m", "decode")) == {}


def test_request_histograms_use_sglangs_names_and_buckets_fed_by_the_endpoint():
    m = WorkerMetrics(SimpleNamespace())
    m.sglang = SglangRequestHistograms(m.registry, tokenizer_labels("m", "decode"))

    async def generate(request, context=None):
        for item in ({"token_ids": [1]}, {"token_ids": [2, 3, 4]}, {"token_ids": [5]}):
            yield item

    async def drain():
        return [item async for item in endpoint(generate, m)({})]

    asyncio.run(drain())
    got = families(m.registry)
    ttft = got["sglang:time_to_first_token_seconds"]
    buckets = [s for s in ttft.samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets][:3] == ["0.1", "0.2", "0.4"]
    assert buckets[0].labels["is_streaming"] == "true"
    assert buckets[0].labels["engine_type"] == "decode"
    count = {s.name: s.value for f in got.values() for s in f.samples if s.name.endswith("_count")}
    assert count["sglang:time_to_first_token_seconds_count"] == 1
    assert count["sglang:inter_token_latency_seconds_count"] == 4  # one per token after the first
    assert count["sglang:e2e_request_latency_seconds_count"] == 1
    assert {"sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
            "sglang:e2e_request_latency_seconds"} <= sglang_declared_names()


def test_component_gauges_have_dynamos_names_and_labels():
    backend = SimpleNamespace(kv_load=lambda engine, page: [
        KvLoad(dp_rank=0, total_blocks=512, usage=0.5, hit_rate=0.25)])
    got = families(ComponentGauges(backend, None, 16, "m", "backend", load_seconds=3.5))
    labels = {"model": "m", "dynamo_component": "backend", "dp_rank": "0"}
    for name, value in (("dynamo_component_total_blocks", 512),
                        ("dynamo_component_gpu_cache_usage_percent", 0.5),
                        ("dynamo_component_kv_cache_hit_rate", 0.25)):
        assert got[name].type == "gauge" and only(got[name]).labels == labels
        assert only(got[name]).value == value
    load = only(got["dynamo_component_model_load_time_seconds"])
    assert load.labels == {"model": "m", "dynamo_component": "backend"} and load.value == 3.5


def test_component_gauges_read_nothing_from_an_engine_without_a_pool():
    got = families(ComponentGauges(SimpleNamespace(kv_load=lambda e, p: None), None, 16, "m",
                                   "backend"))
    assert got == {}


def test_cpu_backend_reports_its_pool_and_hit_rate():
    [load] = CpuBackend().kv_load(FakeCpuEngine(), 16)
    assert load == KvLoad(dp_rank=0, total_blocks=100, usage=0.25, hit_rate=0.25)
    assert CpuBackend().kv_load(SimpleNamespace(), 16) is None  # an attached process


def test_sglang_backend_reads_each_schedulers_load_snapshot():
    snaps = [SimpleNamespace(dp_rank=r, max_total_num_tokens=8190, token_usage=0.5 * r,
                             cache_hit_rate=0.1) for r in (0, 1)]
    reader = SimpleNamespace(read_all=lambda: snaps)
    engine = SimpleNamespace(tokenizer_manager=SimpleNamespace(load_snapshot_reader=reader))
    assert SglangBackend().kv_load(engine, 16) == [  # 8190 tokens: 512 pages, the last partial
        KvLoad(dp_rank=0, total_blocks=512, usage=0.0, hit_rate=0.1),
        KvLoad(dp_rank=1, total_blocks=512, usage=0.5, hit_rate=0.1)]
    unread = SimpleNamespace(tokenizer_manager=SimpleNamespace())
    assert SglangBackend().kv_load(unread, 16) is None


CHILD = """
from prometheus_client import Gauge, Counter
Gauge("sglang:num_running_reqs", "x", ["model_name"], multiprocess_mode="mostrecent"
      ).labels("m").set(3)
Counter("other_total_thing", "y").inc()
"""


@pytest.fixture
def in_process_family():
    counter = Counter("sglang:unit_test_only", "in-process", ["model_name"])
    counter.labels("m").inc(2)
    yield
    REGISTRY.unregister(counter)


def test_passthrough_reads_sglangs_multiprocess_dir_and_this_process(tmp_path, monkeypatch,
                                                                     in_process_family):
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": ""}
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=60)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    got = families(SglangPassthrough())
    assert names(got) == {"sglang:num_running_reqs", "sglang:unit_test_only"}
    assert only(got["sglang:num_running_reqs"]).value == 3
    assert only(got["sglang:unit_test_only"]).value == 2
    # An attached process leaves the directory to the engine process's page.
    assert names(families(SglangPassthrough(multiprocess=False))) == {"sglang:unit_test_only"}


def names(got: dict) -> set[str]:
    return {n for n in got if not n.endswith("_created")}  # the in-process counter's timestamp
