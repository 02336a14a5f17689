"""`components/worker/metrics/worker_metrics.py` without a runtime: the engine read-outs, as
`prometheus_client` renders them (what the endpoint counts and times: test_endpoint.py)."""

import asyncio
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from components.worker.metrics.worker_metrics import PREFIX, WorkerMetrics


class FakeEngine:
    def __init__(self, totals=None):
        self.in_use, self._totals = 3, totals

    def kv_pages_total(self):
        return 10

    def kv_pages_in_use(self):
        return self.in_use

    def kv_pages_cached(self):
        return 2

    def queue_depth(self):
        return 4

    def kv_transfer_totals(self):
        return self._totals


def samples(metrics: WorkerMetrics) -> dict:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, s.labels.get("outcome", "")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_engine_read_outs():
    totals = SimpleNamespace(writes=2, nbytes=4096, seconds=0.5)
    s = samples(WorkerMetrics(FakeEngine(totals)))
    assert s[(f"{PREFIX}_kv_pages_total", "")] == 10
    assert s[(f"{PREFIX}_kv_pages_in_use", "")] == 3
    assert s[(f"{PREFIX}_kv_pages_free", "")] == 7
    assert s[(f"{PREFIX}_kv_pages_cached", "")] == 2
    assert s[(f"{PREFIX}_queue_depth", "")] == 4
    assert s[(f"{PREFIX}_kv_transfers_total", "")] == 2
    assert s[(f"{PREFIX}_kv_transfer_bytes_total", "")] == 4096
    assert s[(f"{PREFIX}_kv_transfer_seconds_total", "")] == 0.5


def test_engines_without_read_outs_add_nothing():
    s = samples(WorkerMetrics(SimpleNamespace()))
    assert not any("kv_pages" in name or "queue" in name for name, _ in s)


def test_preprocess_time_is_observed(tok):
    m = WorkerMetrics(SimpleNamespace())
    pre = m.timed_preprocessor(tok)
    try:
        ids = asyncio.run(pre.chat_token_ids([{"role": "user", "content": "hi"}]))
    finally:
        pre.shutdown()
    assert ids
    assert samples(m)[(f"{PREFIX}_preprocess_seconds_count", "")] == 1
