"""`components/worker/metrics/worker_metrics.py` without a runtime: outcomes, latencies and the
engine read-outs, as `prometheus_client` renders them."""

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from components.worker.metrics.worker_metrics import PREFIX, WorkerMetrics
from handlers.core.errors import EngineUnavailable, PrefillUnavailable, RequestError


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


def stream(*items, error=None):
    async def generate(request, context=None):
        for item in items:
            yield item
        if error is not None:
            raise error
    return generate


async def drain(gen, limit=None):
    out = []
    async for item in gen:
        out.append(item)
        if limit is not None and len(out) == limit:
            await gen.aclose()  # what the runtime does when the client goes away
            break
    return out


def test_a_stop_after_the_last_item_went_out_is_not_a_cancellation():
    m = WorkerMetrics(FakeEngine())
    stopped = SimpleNamespace(is_stopped=lambda: True)  # the decode closed the prefill's stream
    asyncio.run(drain(m.instrument(stream({"room": 1}, {"finished": True}))({}, stopped)))
    asyncio.run(drain(m.instrument(stream({"room": 1}))({}, stopped)))  # before its done item
    s = samples(m)
    assert s[(f"{PREFIX}_requests_total", "success")] == 1
    assert s[(f"{PREFIX}_requests_total", "cancelled")] == 1


def test_outcomes_and_latencies():
    m = WorkerMetrics(FakeEngine())
    ok = m.instrument(stream({"token_ids": [1, 2]}, {"token_ids": [3, 4], "finish_reason": "length"}))
    asyncio.run(drain(ok({})))
    for error in (RequestError("bad"), PrefillUnavailable("gone"),
                  EngineUnavailable("queue full"), RuntimeError("boom")):
        with pytest.raises(type(error)):
            asyncio.run(drain(m.instrument(stream(error=error))({})))
    asyncio.run(drain(m.instrument(stream({"token_ids": [1]}, {"token_ids": [2]}))({}), limit=1))
    stopped = SimpleNamespace(is_stopped=lambda: True)
    asyncio.run(drain(m.instrument(stream({"token_ids": [1]}))({}, stopped)))
    s = samples(m)
    got = {o: s[(f"{PREFIX}_requests_total", o)]
           for o in ("success", "invalid", "unavailable", "error", "cancelled")}
    # 503s (no prefill answered, the engine's queue full) are "unavailable", not "error".
    assert got == {"success": 1, "invalid": 1, "unavailable": 2, "error": 1, "cancelled": 2}
    assert s[(f"{PREFIX}_time_to_first_token_seconds_count", "")] == 3
    assert s[(f"{PREFIX}_inter_token_latency_seconds_count", "")] == 1  # the one second chunk


def test_prefill_items_are_not_tokens():
    m = WorkerMetrics(FakeEngine())
    asyncio.run(drain(m.instrument(stream({"a": 1}, {"b": 2}), streams_tokens=False)({})))
    assert samples(m)[(f"{PREFIX}_inter_token_latency_seconds_count", "")] == 0


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
