"""SGLang's own 503 aborts reach the client as 503s, on `sglang.Engine` (SGLang's CPU path),
aggregated: with one running and one queued request allowed (`--max-running-requests 1
--max-queued-requests 1`; SGLang ignores the queue limit in disaggregated modes), SGLang's
scheduler turns further requests away with "The request queue is full." and a 503 status, and
the worker passes that on as a 503 rather than a 500. The requests it admits are served.

The same stack runs with `--enable-metrics` (one SGLang engine start serves both checks): the
worker's `/metrics` shows SGLang's own `sglang:*` metrics, scheduler and tokenizer side, and
Dynamo's standard engine gauges, as Dynamo 1.6.1's SGLang worker does."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from harness.topology import wait_until
from harness.worker_metrics import scrape
from tests.e2e.client import user
from tests.e2e.metric_names import check_component_gauges, check_sglang_gauges
from tests.support.topologies import SGLANG, start_sglang_topology

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path):
    stack = start_sglang_topology(
        tmp_path_factory.mktemp("sglang-queue"), tiny_model_path, True, with_agg=False,
        extra=("--max-running-requests", "1", "--max-queued-requests", "1", "--enable-metrics"))
    yield stack
    stack.stop()


def status(url: str, i: int) -> int:
    body = {"model": SGLANG, "messages": user(f"a long answer {i}"), "max_tokens": 1000,
            "ignore_eos": True}
    with httpx.Client(timeout=120) as http:
        return http.post(f"{url}/v1/chat/completions", json=body).status_code


def test_a_full_queue_is_a_503_and_admitted_requests_are_served(stack):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(lambda i: status(stack.url, i), range(4)))
    assert 503 in codes and 200 in codes and set(codes) <= {200, 503}, codes
    assert "The request queue is full." in stack.procs["sglang"].log_text()
    assert stack.procs["sglang"].requests_in_flight() == 0


def test_metrics_show_sglangs_own_and_dynamos_standard_names(stack):
    port = stack.procs["sglang"].system_port
    before = scrape(port)
    body = {"model": SGLANG, "messages": user("count"), "max_tokens": 8, "ignore_eos": True}
    with httpx.Client(timeout=120) as http:
        r = http.post(f"{stack.url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]

    def counted() -> bool:  # SGLang's tokenizer counts a request as it finishes it
        return scrape(port)[("sglang:generation_tokens_total", "")] >= \
            before[("sglang:generation_tokens_total", "")] + 8

    wait_until(counted, 15, "SGLang's generation token counter")
    after = scrape(port)
    assert after[("sglang:prompt_tokens_total", "")] - \
        before[("sglang:prompt_tokens_total", "")] == prompt_tokens
    assert after[("sglang:time_to_first_token_seconds_count", "")] > \
        before[("sglang:time_to_first_token_seconds_count", "")]
    check_sglang_gauges(port, SGLANG, "unified")  # the scheduler's, from its process
    gauges = check_component_gauges(port, SGLANG, "sglang")
    assert 0 < gauges["dynamo_component_total_blocks"] <= 8192  # --max-total-tokens, in pages
