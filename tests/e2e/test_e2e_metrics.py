"""The workers' Prometheus metrics (`components/worker/metrics/worker_metrics.py`) on the real
standard topology, scraped from each worker's system port (`/metrics` on DYN_SYSTEM_PORT) before,
during and after a burst of disaggregated requests: the counts match what was sent, the KV pages in
use rise during the load and come back to 0 (free = total) after, and the prefill counts one KV
WRITE per request. Also SGLang's `sglang:*` names and Dynamo's standard engine gauges, as Dynamo
1.6.1's SGLang worker shows them, on every CPU-engine worker (SGLang's own: the last test of
tests/e2e/test_e2e_sglang_queue.py)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from harness.topology import Proc, wait_until
from harness.worker_metrics import Samples
from harness.worker_metrics import scrape as scrape_port
from tests.e2e.client import post, user
from tests.e2e.metric_names import check_component_gauges, check_sglang_gauges, one
from tests.support.topologies import AGG, CONTEXT_LENGTH, DISAGG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

P = "dynamo_component_engine_"
BURST = 6
# Long enough that a scrape every 50 ms sees the decode's pages in use on a fast run too.
MAX_TOKENS = 600


def scrape(proc: Proc) -> Samples:
    return scrape_port(proc.system_port)


def delta(after: dict, before: dict, name: str, outcome: str = "") -> float:
    return after[(name, outcome)] - before[(name, outcome)]


def send_burst(url: str) -> list[int]:
    body = {"model": DISAGG, "messages": user("a long answer please"), "max_tokens": MAX_TOKENS,
            "ignore_eos": True}

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            rs = await asyncio.wait_for(asyncio.gather(
                *(client.post(f"{url}/v1/chat/completions", json=body) for _ in range(BURST))), 180)
        return [r.status_code for r in rs]

    return asyncio.run(run())


def test_metrics_follow_a_burst_of_requests(tokens_stack, http):
    decode, prefill = tokens_stack.procs["decode"], tokens_stack.procs["prefill"]
    d0, p0 = scrape(decode), scrape(prefill)
    statuses: list[int] = []
    burst = threading.Thread(target=lambda: statuses.extend(send_burst(tokens_stack.url)))
    burst.start()
    peak = 0.0
    while burst.is_alive():  # the thread's own wait is bounded (asyncio.wait_for)
        peak = max(peak, scrape(decode)[(P + "kv_pages_in_use", "")])
        burst.join(0.05)
    assert statuses == [200] * BURST
    # Over the context: a 400, counted as invalid by the worker that refused it. Decode-
    # orchestrated, that is the decode; frontend-orchestrated, the frontend runs both legs at
    # once and either may refuse first (the other leg is then cancelled or never sent).
    r = post(http, tokens_stack.url, "completions",
             {"model": DISAGG, "max_tokens": 4, "prompt": [7] * (CONTEXT_LENGTH + 10)})
    assert r.status_code == 400, r.text

    def refused() -> float:
        return (delta(scrape(decode), d0, P + "requests_total", "invalid")
                + delta(scrape(prefill), p0, P + "requests_total", "invalid"))

    def outcomes(d: Samples) -> float:
        return sum(delta(d, d0, P + "requests_total", o) for o in
                   ("success", "invalid", "cancelled", "unavailable", "error"))

    def settled() -> bool:
        """Pages free, and every request counted: ours count as a request ends (maybe after
        the client has its 400), Dynamo's as it arrives."""
        pages_free = all(scrape(p)[(P + "kv_pages_in_use", "")] == 0 for p in (decode, prefill))
        d = scrape(decode)
        ends_counted = delta(d, d0, "dynamo_component_requests_total") == outcomes(d)
        return pages_free and ends_counted and refused() >= 1

    wait_until(settled, 15, "KV pages in use back to 0 and every request counted")
    d1, p1 = scrape(decode), scrape(prefill)

    assert peak > 0
    assert delta(d1, d0, P + "requests_total", "success") == BURST
    assert 1 <= refused() <= 2  # by one worker or both
    # Dynamo's own per-endpoint request counter agrees with ours (checked in settled).
    assert outcomes(d1) in (BURST, BURST + 1)
    assert delta(d1, d0, P + "time_to_first_token_seconds_count") == BURST
    assert BURST <= delta(d1, d0, P + "inter_token_latency_seconds_count") <= BURST * MAX_TOKENS
    assert delta(p1, p0, P + "requests_total", "success") == BURST
    assert delta(p1, p0, P + "kv_transfers_total") == BURST
    assert delta(p1, p0, P + "kv_transfer_bytes_total") > 0
    assert delta(p1, p0, P + "kv_transfer_seconds_total") > 0
    # The decode's loop was sampled while its streams (6 x 600 tokens, over a second) ran.
    assert delta(d1, d0, P + "event_loop_lag_seconds_count") > 0
    for after, before in ((d1, d0), (p1, p0)):
        assert after[(P + "kv_pages_free", "")] == after[(P + "kv_pages_total", "")] > 0
        assert after[(P + "queue_depth", "")] == 0


def test_sglang_and_dynamo_standard_names_on_the_cpu_engine(tokens_stack, http):
    """SGLang's names with SGLang's labels on every worker, and Dynamo's standard engine gauges;
    on the aggregated worker, one prompt sent twice: its tokens counted, the second served from
    the prefix cache (hit rate above 0), and the request histograms observed."""
    agg = tokens_stack.procs["agg"]
    before = scrape(agg)
    prompt = list(range(10, 310))
    used = []
    for _ in range(2):
        r = post(http, tokens_stack.url, "completions", {"model": AGG, "prompt": prompt,
                                                          "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200, r.text
        used.append(r.json()["usage"])
    wait_until(lambda: scrape(agg)[(P + "kv_pages_in_use", "")] == 0, 15, "agg's pages free")
    after = scrape(agg)

    def grew(name: str) -> float:
        return after[(name, "")] - before[(name, "")]

    assert grew("sglang:prompt_tokens_total") == sum(u["prompt_tokens"] for u in used) >= 600
    assert grew("sglang:generation_tokens_total") == 16
    assert grew("sglang:num_requests_total") == 2
    assert grew("sglang:cached_tokens_total") >= 256  # the second request's whole pages
    assert grew("sglang:time_to_first_token_seconds_count") == 2
    assert grew("sglang:e2e_request_latency_seconds_count") == 2
    assert 0 < grew("sglang:inter_token_latency_seconds_count") <= 14
    for proc, model, kind in ((agg, AGG, "unified"), (tokens_stack.procs["decode"], DISAGG,
                                                      "decode"),
                              (tokens_stack.procs["prefill"], DISAGG, "prefill")):
        check_sglang_gauges(proc.system_port, model, kind)
    assert one(agg.system_port, "sglang:cache_hit_rate")["value"] > 0
    assert one(agg.system_port, "sglang:num_running_reqs")["value"] == 0
    gauges = check_component_gauges(agg.system_port, AGG, "agg")
    assert gauges["dynamo_component_total_blocks"] == after[(P + "kv_pages_total", "")]
    assert gauges["dynamo_component_gpu_cache_usage_percent"] == 0  # every request finished
    assert gauges["dynamo_component_kv_cache_hit_rate"] > 0
