"""Faults on the real `sglang.Engine` (SGLang's CPU path), disaggregated over NIXL, in both
orchestration styles: prompt logprobs (computed by the prefill) equal transformers' forward;
extreme but valid sampling values never fail, nor touch a concurrent
greedy stream (it comes out exactly as alone); a hung prefill is answered within the bound; a
killed prefill's clients are all answered within 30 s and a new prefill worker restores
service; SIGTERM under traffic lets the streams finish and both workers exit 0.

One stack per style for the module, Tokens mode; the tests run in this order and the later
ones break the stack (the hung and killed prefill, then SIGTERM).
"""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time

import httpx
import pytest

from harness.topology import wait_until
from tests.e2e.client import post, stream, user
from tests.e2e.logprobs_checks import check_prompt_logprobs_vs_transformers
from tests.support.topologies import (
    DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED, SGLANG, start_sglang_prefill,
    start_sglang_topology,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

PREFILL_WAIT_S = 5.0
# A hung prefill: decode's --prefill-wait-timeout (503), or the frontend's request plane (504
# over TCP after about 5 s; seen as a 503 too under load in CI).
HUNG_STATUS = {DECODE_ORCHESTRATED: {503}, FRONTEND_ORCHESTRATED: {503, 504}}
ANSWERED_BOUND_S = 30.0
DEAD_PREFILL_RETRY_S = 30.0
WITNESS = {"model": SGLANG, "messages": user("count with me: 1 2 3"), "max_tokens": 24,
           "temperature": 0.0, "ignore_eos": True, "stream": True}
EXTREME = [{"temperature": 3e38}, {"temperature": 1.1e-6},
           {"repetition_penalty": 1e-20, "temperature": 1.0},
           {"frequency_penalty": 2, "presence_penalty": -2, "temperature": 1.0},
           {"top_k": 1 << 30, "top_p": 1e-30, "min_p": 1}, {"seed": -(1 << 63), "temperature": 1},
           {"logprobs": True, "top_logprobs": 20, "temperature": 3e38}, {"max_tokens": 1},
           {"stop": [f"{i}" * 40 for i in range(32)]}]


# The decode-orchestrated stack's faults are in the SGLang core `make test` runs on 0.5.21 too.
@pytest.fixture(scope="module", params=[
    pytest.param(DECODE_ORCHESTRATED, marks=pytest.mark.sglang_core), FRONTEND_ORCHESTRATED],
                ids=["decode-orch", "frontend-orch"])
def stack(tmp_path_factory, tiny_model_path, request):
    extra = ("--prefill-wait-timeout", str(PREFILL_WAIT_S))
    stack = start_sglang_topology(tmp_path_factory.mktemp(f"sglang-faults-{request.param}"),
                                  tiny_model_path, True, disaggregated=True,
                                  orchestrator=request.param, with_agg=False, extra=extra)
    stack.style, stack.extra = request.param, extra
    yield stack
    stack.stop()


def chat_status(url: str, body: dict) -> tuple[int, float]:
    with httpx.Client(timeout=120) as client:
        t0 = time.monotonic()
        r = post(client, url, "chat/completions", body)
        return r.status_code, time.monotonic() - t0


def test_prompt_logprobs_equal_transformers(stack, http, tokenizer, tiny_model_path):
    # Both styles on SGLang (test_e2e_sglang_disagg.py compares frontend-orchestrated ones with
    # the aggregated CPU engine, which equals transformers within the same bound).
    check_prompt_logprobs_vs_transformers(http, stack.url, tokenizer, tiny_model_path,
                                          "Once upon a time, the sea", SGLANG)


def test_extreme_sampling_leaves_a_concurrent_stream_exactly_as_alone(stack):
    with httpx.Client(timeout=120) as http:
        alone = stream(http, stack.url, "chat/completions", WITNESS)
    assert alone.error is None and alone.done
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        extreme = [pool.submit(chat_status, stack.url,
                               {"model": SGLANG, "messages": user("hi"), "max_tokens": 8, **x})
                   for x in EXTREME]
        with httpx.Client(timeout=120) as http:
            beside = [stream(http, stack.url, "chat/completions", WITNESS) for _ in range(2)]
        statuses = [f.result()[0] for f in extreme]
    assert all(s < 500 for s in statuses), list(zip(statuses, EXTREME))
    for got in beside:  # (a radix-cache hit may change cached_tokens, nothing else)
        assert (got.error, got.text, got.usage["completion_tokens"]) == (
            None, alone.text, alone.usage["completion_tokens"])


def test_hung_then_killed_prefill_answers_every_client_and_a_new_one_restores_service(stack):
    assert chat_status(stack.url, {"model": SGLANG, "messages": user("hi"),
                                   "max_tokens": 4})[0] == 200
    prefill = stack.procs["prefill"]  # stays listed: a failure here still stops it at teardown
    prefill.signal_group(signal.SIGSTOP)
    status, elapsed = chat_status(stack.url, {"model": SGLANG, "messages": user("hello"),
                                              "max_tokens": 4})
    assert status in HUNG_STATUS[stack.style] and elapsed < PREFILL_WAIT_S + 10, (status, elapsed)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(chat_status, stack.url, {"model": SGLANG, "messages": user(
            f"waiting {i}"), "max_tokens": 4}) for i in range(4)]
        # Under way, waiting or answered: with the frontend orchestrating, the frontend, having
        # seen this prefill time out, may answer them at once (503 within milliseconds).
        wait_until(lambda: all(f.running() or f.done() for f in waiting), 10,
                   "the clients under way")
        killed = time.monotonic()
        prefill.signal_group(signal.SIGKILL)
        done, _ = concurrent.futures.wait(waiting, ANSWERED_BOUND_S)
        assert len(done) == 4, "a client was not answered within the bound"
    assert time.monotonic() - killed < ANSWERED_BOUND_S
    assert all(f.result()[0] >= 500 for f in waiting)
    wait_until(lambda: stack.procs["sglang"].requests_in_flight() == 0, 15,
               "the decode's request table to empty")

    prefill.popen.wait(10)
    del stack.procs["prefill"]
    start_sglang_prefill(stack, "prefill2", True, stack.style, stack.extra)
    wait_until(lambda: chat_status(stack.url, {"model": SGLANG, "messages": user("back?"),
                                               "max_tokens": 4})[0] == 200,
               180, "a request served through the new prefill worker", interval=1.0)
    stack.procs["prefill"] = stack.procs.pop("prefill2")


def test_sigterm_under_traffic_lets_the_streams_finish_and_both_workers_exit_zero(stack):
    results: list = []
    streaming = threading.Semaphore(0)  # released at each stream's first event

    def one() -> None:
        # Frontend-orchestrated, the frontend's round robin may still list the prefill the test
        # before killed (file discovery keeps it): a stream sent there is a 503 at once, so it
        # is sent again, for a bounded time.
        with httpx.Client(timeout=120) as http:
            results.append(stream(http, stack.url, "chat/completions",
                                  {**WITNESS, "max_tokens": 1000}, on_first=streaming.release,
                                  retry_503_s=DEAD_PREFILL_RETRY_S))

    clients = [threading.Thread(target=one) for _ in range(3)]
    for c in clients:
        c.start()
    for _ in clients:  # all three under way (a 1,000-token stream takes seconds here)
        assert streaming.acquire(timeout=60), "a stream never started"
    codes = {}
    for name in ("sglang", "prefill"):  # the worker process alone, as Kubernetes signals PID 1
        stack.procs[name].popen.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(120)
    for name in ("sglang", "prefill"):
        codes[name] = stack.procs[name].reap(60)
    assert [(r.error, (r.usage or {}).get("completion_tokens")) for r in results] == [
        (None, 1000)] * 3, results
    assert codes == {"sglang": 0, "prefill": 0}
