"""SGLang's own 503 aborts reach the client as 503s, on `sglang.Engine` (SGLang's CPU path),
aggregated: with one running and one queued request allowed (`--max-running-requests 1
--max-queued-requests 1`; SGLang ignores the queue limit in disaggregated modes), SGLang's
scheduler turns further requests away with "The request queue is full." and a 503 status, and
the worker passes that on as a 503 rather than a 500. The requests it admits are served."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.e2e.client import user
from tests.support.topologies import SGLANG, start_sglang_topology

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path):
    stack = start_sglang_topology(
        tmp_path_factory.mktemp("sglang-queue"), tiny_model_path, True, with_agg=False,
        extra=("--max-running-requests", "1", "--max-queued-requests", "1"))
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
