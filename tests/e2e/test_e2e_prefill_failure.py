"""A prefill worker that rejects, hangs or dies: a rejection is the client's 400 with the prefill's
message, a hang a 503/504 within the bound, a death an error within the bound; the decode worker
frees what it held, and serves again once a new prefill worker is up (the dead one stays listed
in file discovery; whoever orchestrates retries it only after a backoff). Both orchestration
styles: decode-orchestrated (decode's --prefill-wait-timeout bounds a hang: 503) and
frontend-orchestrated (the frontend's request plane bounds it: 504 "Request deadline exceeded"
after about 5 s over TCP, 503 over NATS; the same bound the tests give decode). Each with file discovery + TCP and with
etcd + NATS (where the dead worker's keys go when its etcd lease expires)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from harness.topology import Stack, wait_until
from tests.e2e.client import error_message, post, user
from tests.support.topologies import (
    DECODE_ORCHESTRATED, DISAGG, FRONTEND_ORCHESTRATED, PREFILL_WAIT_S, start_prefill,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REQUEST = {"model": DISAGG, "messages": user("hello"), "max_tokens": 4, "temperature": 0.0}
PREFILL_POOL = ("--max-total-tokens", "1024")


# What a hung prefill answers the client, per style and request plane: decode's bound is a 503;
# the frontend's is its request plane's, 504 over TCP and 503 over NATS.
HUNG_STATUS = {(DECODE_ORCHESTRATED, "file"): 503, (FRONTEND_ORCHESTRATED, "file"): 504,
               (DECODE_ORCHESTRATED, "etcd"): 503, (FRONTEND_ORCHESTRATED, "etcd"): 503}


@pytest.fixture(scope="module", params=[
    (DECODE_ORCHESTRATED, "file"), (FRONTEND_ORCHESTRATED, "file"),
    (DECODE_ORCHESTRATED, "etcd"), (FRONTEND_ORCHESTRATED, "etcd"),
], ids=["decode-orch", "frontend-orch", "decode-orch-etcd", "frontend-orch-etcd"])
def setup(request) -> tuple[str, str]:
    """(orchestration style, discovery): file discovery + TCP, or etcd + NATS."""
    return request.param


@pytest.fixture(scope="module")
def orchestrator(setup) -> str:
    return setup[0]


@pytest.fixture(scope="module")
def stack(start_stack, setup, request) -> Iterator[Stack]:
    # The prefill's KV pool (1,024 tokens) is smaller than decode's: a prompt between the two
    # passes every decode check and only the prefill engine refuses it.
    orchestrator, discovery = setup
    services = request.getfixturevalue("etcd_nats") if discovery == "etcd" else None
    stack = start_stack(f"failure-{orchestrator}-{discovery}", skip_tokenizer_init=True,
                        with_agg=False, prefill_args=PREFILL_POOL, orchestrator=orchestrator,
                        discovery=services)
    yield stack
    stack.stop()  # before the next one starts


def timed_post(url: str) -> tuple[httpx.Response, float]:
    with httpx.Client(timeout=120) as client:
        t0 = time.monotonic()
        r = post(client, url, "chat/completions", REQUEST)
        return r, time.monotonic() - t0


def test_what_the_prefill_rejects_is_a_400_with_its_message(stack):
    with httpx.Client(timeout=60) as client:
        r = post(client, stack.url, "completions",
                 {"model": DISAGG, "prompt": [7] * 1500, "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "KV space for 1500 tokens" in error_message(r), r.text
    wait_until(lambda: stack.procs["decode"].kv_pages_in_use() == 0
               and stack.procs["prefill"].kv_pages_in_use() == 0, 15, "pages back to 0")
    ok, _ = timed_post(stack.url)
    assert ok.status_code == 200, ok.text


def test_hung_then_killed_prefill_fails_requests_fast_and_a_new_prefill_restores_service(
        stack, orchestrator, setup):
    ok, _ = timed_post(stack.url)
    assert ok.status_code == 200, ok.text
    prefill = stack.procs["prefill"]

    # Hung prefill: no bootstrap info ever comes; the wait is bounded (module docstring) and
    # the client gets a 503 or 504 (the 1.6.1 frontend words it; the worker logs the reason).
    prefill.signal_group(signal.SIGSTOP)
    r, elapsed = timed_post(stack.url)
    assert r.status_code == HUNG_STATUS[setup], r.text
    assert elapsed < PREFILL_WAIT_S + 10, elapsed

    # Killed mid-request: a request is waiting on the frozen prefill when it dies.
    result: dict = {}
    waiter = threading.Thread(target=lambda: result.update(zip(("r", "t"), timed_post(stack.url))))
    waiter.start()
    # Not a synchronization: the assertions hold whenever the kill lands (a request that
    # finds the prefill gone fails within the connect bound); this makes "mid-request" likely.
    time.sleep(1.0)
    killed_at = time.monotonic()
    prefill.signal_group(signal.SIGKILL)
    waiter.join(PREFILL_WAIT_S + 30)
    assert not waiter.is_alive(), "the request hung after its prefill worker died"
    assert result["r"].status_code >= 500, result["r"].text
    assert time.monotonic() - killed_at < PREFILL_WAIT_S + 10
    wait_until(lambda: stack.procs["decode"].kv_pages_in_use() == 0, 15, "decode pages freed")

    # A new prefill worker: decode serves again.
    prefill.popen.wait(10)
    del stack.procs["prefill"]
    start_prefill(stack, "prefill2", skip_tokenizer_init=True, orchestrator=orchestrator)

    def served() -> bool:
        stack.check_alive()
        return timed_post(stack.url)[0].status_code == 200

    wait_until(served, 120, "a request served through the new prefill worker", interval=1.0)
    wait_until(lambda: stack.procs["decode"].kv_pages_in_use() == 0
               and stack.procs["prefill2"].kv_pages_in_use() == 0, 15, "pages back to 0")


def test_sigterm_unregisters_drains_and_exits_zero(stack):
    """Runs after the failure test (same module topology): stop both workers with SIGTERM."""
    result: dict = {}
    body = {**REQUEST, "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=60) as client:
        def in_flight() -> None:
            # Frontend-orchestrated, the frontend's round robin may still list the prefill
            # killed by the test before (file discovery keeps it; etcd until its lease ends): a
            # request it sends there is a 503 at once, so try again, for a bounded time.
            def served() -> bool:
                result["r"] = post(client, stack.url, "chat/completions", body)
                return result["r"].status_code != 503

            wait_until(served, 30, "a request that reaches a live prefill", interval=0.2)

        request = threading.Thread(target=in_flight)
        request.start()
        wait_until(lambda: stack.procs["decode"].kv_pages_in_use() > 0, 45,
                   "the request to be decoding")
        assert stack.procs["decode"].stop(timeout=60) == 0
        request.join(60)
    # In flight when SIGTERM arrived: drained, not cut off.
    assert result["r"].status_code == 200, result["r"].text
    assert result["r"].json()["usage"]["completion_tokens"] == 1500
    wait_until(lambda: DISAGG not in stack.models(), 15, "the model to be unregistered")
    prefill = next(p for n, p in stack.procs.items() if n.startswith("prefill"))
    assert prefill.stop(timeout=60) == 0
