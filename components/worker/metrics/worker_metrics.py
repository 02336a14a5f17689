"""The worker's Prometheus metrics, served by Dynamo's system status server (`/metrics` on
`DYN_SYSTEM_PORT`) next to the runtime's own `dynamo_component_*` request metrics.

Dynamo 1.6.1 gives Python one way onto that page: a callback on the endpoint that returns
exposition text (`endpoint.metrics.register_prometheus_expfmt_callback`), which Dynamo's helper
`register_engine_metrics_callback` wires to a `prometheus_client` registry and labels with the
worker's `dynamo_namespace`, `dynamo_component`, `dynamo_endpoint`, `worker_id` and `model`, as
Dynamo's own SGLang worker does for SGLang's metrics (`components/worker/metrics/metrics_export.py`
registers it, with SGLang's `sglang:*` names, sglang_metrics.py, and Dynamo's standard
engine gauges, component_gauges.py).

Measured here, per worker:
- at the endpoint (both engines): requests by outcome, time to first item (TTFT; on a prefill
  worker, until its KV hand-off answer), inter-token latency between streamed chunks;
- Text mode: the chat template + tokenization time (Tokens mode: the frontend preprocesses);
- the event loop's lag (`components/worker/metrics/loop_lag.py`): every stream of the process waits
  that long;
- read from the CPU engine at scrape time: KV pages in use / free / cached / total, requests
  waiting for admission, and (prefill) completed KV WRITEs with their bytes and seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from handlers.core.outcome import Outcome
from handlers.text.preprocess import Preprocessor

from components.worker.metrics.loop_lag import LoopLagMonitor

PREFIX = "dynamo_component_engine"
# Loop lag is judged against a couple of milliseconds (one token's gap on a fast GPU).
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)


class WorkerMetrics:
    """One registry per worker process; the endpoint (components/worker/lifecycle/endpoint.py)
    times each request with `start_request`."""

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(f"{PREFIX}_requests", "Requests the worker finished, by outcome",
                                ["outcome"], registry=self.registry)
        for outcome in Outcome:  # every series exists from the start, at 0
            self.requests.labels(outcome.value)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "Request arrival at the worker to its first streamed item",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Gap between streamed chunks, per token they carry",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.preprocess = Histogram(f"{PREFIX}_preprocess_seconds",
                                    "Text mode: chat template and tokenization of one request",
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.loop_lag = Histogram(f"{PREFIX}_event_loop_lag_seconds",
                                  "How much later than asked the worker's event loop woke a "
                                  "sampling timer, while requests are in flight",
                                  buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        self.lag = LoopLagMonitor(self.loop_lag.observe)  # started on the worker's loop
        self.registry.register(EngineCollector(engine))
        # SGLang's request histograms where the worker measures them for its engine (the CPU
        # engine; components/worker/metrics/sglang_metrics.py); SGLang measures its own.
        self.sglang: Optional[Any] = None

    def start_request(self, streams_tokens: bool = True) -> "RequestTiming":
        """A request arrived at the endpoint (components/worker/lifecycle/endpoint.py); a prefill
        worker's (`streams_tokens=False`) items are hand-off messages, not tokens: no ITL."""
        return RequestTiming(self, streams_tokens)

    def timed_preprocessor(self, tokenizer: Any) -> Preprocessor:
        return TimedPreprocessor(tokenizer, self.preprocess.observe)


class RequestTiming:
    """One request at the endpoint: its first item (TTFT), the gaps between items (ITL, per
    token they carry) and its last finish reason; `end` counts it by its outcome."""

    def __init__(self, metrics: WorkerMetrics, streams_tokens: bool) -> None:
        self._metrics = metrics
        self._streams_tokens = streams_tokens
        self._start = self._last = time.monotonic()
        self._items = 0
        self.finish: Optional[str] = None
        metrics.lag.request_started()

    def item(self, item: Any) -> None:
        now = time.monotonic()
        if self._items == 0:
            self._first(now - self._start)
        elif self._streams_tokens:
            self._gap(now - self._last, max(1, _tokens_in(item)))
        self._items += 1
        self._last = now
        self.finish = _finish_reason(item) or self.finish

    def _first(self, seconds: float) -> None:
        self._metrics.ttft.observe(seconds)
        if self._metrics.sglang is not None:
            self._metrics.sglang.observe_ttft(seconds)

    def _gap(self, seconds: float, tokens: int) -> None:
        self._metrics.itl.observe(seconds / tokens)
        if self._metrics.sglang is not None:
            self._metrics.sglang.observe_itl(seconds / tokens, tokens)

    def end(self, outcome: Outcome) -> None:
        metrics = self._metrics
        if metrics.sglang is not None and outcome is Outcome.SUCCESS:
            metrics.sglang.observe_e2e(time.monotonic() - self._start)
        metrics.lag.request_finished()
        metrics.requests.labels(outcome.value).inc()


class TimedPreprocessor(Preprocessor):
    """The Text-mode preprocessor, timing each request's template + tokenization."""

    def __init__(self, tokenizer: Any, observe: Callable[[float], None]) -> None:
        super().__init__(tokenizer)
        self._observe = observe

    async def chat_token_ids(self, messages: list[dict[str, Any]],
                             template_kwargs: Optional[dict] = None,
                             tools: Optional[list[dict[str, Any]]] = None) -> list[int]:
        start = time.monotonic()
        try:
            return await super().chat_token_ids(messages, template_kwargs, tools)
        finally:
            self._observe(time.monotonic() - start)


class EngineCollector:
    """Gauges and counters read from the engine when `/metrics` is scraped (nothing on the hot
    path). Engines without a read-out (SGLang reports its own) contribute nothing."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def describe(self) -> list[Metric]:
        return []  # families vary with the engine; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        if callable(getattr(engine, "kv_pages_total", None)):
            total = engine.kv_pages_total()
            in_use = engine.kv_pages_in_use()
            cached = engine.kv_pages_cached()
            yield _gauge("kv_pages_total", "KV pool pages", total)
            yield _gauge("kv_pages_in_use", "KV pages held by live requests or transfers", in_use)
            yield _gauge("kv_pages_cached", "KV pages the prefix cache keeps (evicted on demand)",
                         cached)
            yield _gauge("kv_pages_free", "KV pages a new request can get (total - in use)",
                         total - in_use)
        if callable(getattr(engine, "queue_depth", None)):
            yield _gauge("queue_depth", "Requests waiting for admission", engine.queue_depth())
        totals_of = getattr(engine, "kv_transfer_totals", None)
        totals = totals_of() if callable(totals_of) else None
        if totals is not None:
            yield _counter("kv_transfers", "KV WRITEs to decode completed", totals.writes)
            yield _counter("kv_transfer_bytes", "Bytes of KV written to decode", totals.nbytes)
            yield _counter("kv_transfer_seconds", "Seconds from posting to completing KV WRITEs",
                           totals.seconds)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _tokens_in(item: dict[str, Any]) -> int:
    """Tokens mode: the delta's token count; Text mode: one per chunk."""
    ids = item.get("token_ids") if isinstance(item, dict) else None
    return len(ids) if isinstance(ids, list) else 1


def _finish_reason(item: Any) -> Optional[str]:
    if not isinstance(item, dict):
        return None
    if item.get("finish_reason"):
        return item["finish_reason"]
    if item.get("finished") is True:  # a decode-orchestrated prefill's done item (PrefillDone)
        return "prefill_done"
    choices = item.get("choices") or ()
    return choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
