"""A request whose decode half ends stops its prefill at once, in both orchestration styles and
on both engines (the CPU engine, and `sglang.Engine` on SGLang's CPU path): clients that leave
before the first token with prompts of most of the KV pool, an abort storm, and a SIGKILLed
decode worker. Afterwards the prefill holds no request (and, on the CPU engine, no KV page) and
a short request is served at once (nothing queued behind dead work).

Frontend-orchestrated, the frontend's prefill leg is never told (Dynamo 1.6.1); the decode half
tells it through the room watch (docs/reference/room-watch.md). One stack per engine
and style for the module; the kill test comes last, since it breaks it.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from dataclasses import dataclass

import httpx
import pytest

from harness.topology import Stack, wait_until
from tests.e2e.client import chat, user
from tests.support.topologies import (
    DECODE_ORCHESTRATED, DISAGG, FRONTEND_ORCHESTRATED, SGLANG, start_sglang_topology,
    start_topology,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

# The prefill's request and KV are released within this of the clients leaving: one engine step
# (a chunk of the prompt) plus the room watch's hop, with slack for 2 shared cores.
RELEASE_BOUND_S = 10.0
# A leg no decode claims ends after the prefill's --room-claim-timeout: a decode killed before
# it claimed, or (decode-orchestrated) one whose stop Dynamo's runtime lost because the decode
# gave up while the prefill's response stream was still connecting (it never got the room).
# Decode-orchestrated, the decode claims as soon as the prefill's first item arrives, so these
# stacks use a shorter deadline than the default 10 s.
CLAIM_TIMEOUT_S = {DECODE_ORCHESTRATED: 4.0, FRONTEND_ORCHESTRATED: 10.0}
KILL_BOUND_S = 10.0 + RELEASE_BOUND_S
STYLES = {"decode-orch": DECODE_ORCHESTRATED, "frontend-orch": FRONTEND_ORCHESTRATED}
# Tokens the kill test's requests ask for: a long prompt plus this still fits either pool.
LONG_ANSWER = 1000


@dataclass(frozen=True)
class Engine:
    name: str
    model: str
    decode: str  # the decode worker's process name in its topology
    pool_tokens: int  # a context and pool that hold one long prompt at a time
    long_prompt: int  # most of the pool: a second one waits for the first to go

    def start(self, workdir, model_path: str, style: str) -> Stack:
        args = ("--context-length", str(self.pool_tokens),
                "--max-total-tokens", str(self.pool_tokens),
                "--room-claim-timeout", str(CLAIM_TIMEOUT_S[style]))
        if self.name == "cpu":
            return start_topology(workdir, model_path, True, with_agg=False, worker_args=args,
                                  orchestrator=style)
        return start_sglang_topology(workdir, model_path, True, disaggregated=True,
                                     orchestrator=style, with_agg=False, extra=args)


ENGINES = {"cpu": Engine("cpu", DISAGG, "decode", 8192, 6000),
           "sglang": Engine("sglang", SGLANG, "sglang", 4096, 3000)}
COMBOS = [(e, s) for e in ENGINES for s in STYLES]


@pytest.fixture(scope="module", params=COMBOS, ids=[f"{e}-{s}" for e, s in COMBOS])
def stack(tmp_path_factory, tiny_model_path, request):
    engine, style = ENGINES[request.param[0]], STYLES[request.param[1]]
    stack = engine.start(tmp_path_factory.mktemp(f"rooms-{'-'.join(request.param)}"),
                         tiny_model_path, style)
    # One request through both workers first: the CPU engine's KV side channel can lose a fresh
    # decode's first connection to a room aborted before its socket reports it connected (a
    # known bug, docs/failure-behaviour.md), which is not what these tests are about.
    stack.wait_ready(engine.model, probe=True)
    stack.engine = engine
    yield stack
    stack.stop()


def long_body(engine: Engine, i: int) -> dict:
    # Distinct prompts: no prefix-cache hit makes one of them cheap.
    return {"model": engine.model, "prompt": [7 + i] + [9] * (engine.long_prompt - 1),
            "max_tokens": 50, "ignore_eos": True, "stream": True}


def leave_after_headers(url: str, body: dict) -> None:
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            assert r.status_code == 200  # headers only; close before any token is read


def prefill_idle(stack) -> bool:
    p = stack.procs["prefill"]
    # SGLang reports no page count here; its request table empties once the KV is freed.
    return p.requests_in_flight() == 0 and (stack.engine.name != "cpu"
                                            or p.kv_pages_in_use() == 0)


def decode_idle(stack) -> bool:
    d = stack.procs[stack.engine.decode]
    return d.requests_in_flight() == 0 and (stack.engine.name != "cpu"
                                            or d.kv_pages_in_use() == 0)


def assert_released_and_serving(stack, left_at: float) -> float:
    try:
        wait_until(lambda: prefill_idle(stack), RELEASE_BOUND_S, "the prefill to hold nothing")
    except TimeoutError:  # which requests, to find them in the worker's log
        print("prefill still holds", stack.procs["prefill"].engine_route("requests"))
        raise
    released = time.monotonic() - left_at
    wait_until(lambda: decode_idle(stack), RELEASE_BOUND_S, "the decode to hold nothing")
    with httpx.Client(timeout=RELEASE_BOUND_S) as http:  # nothing queued behind dead work
        ok = chat(http, stack.url, {"model": stack.engine.model, "messages": user("next"),
                                    "max_tokens": 2})
    assert ok["usage"]["completion_tokens"] == 2
    return released


def test_clients_leaving_before_the_first_token_stop_the_prefill(stack):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: leave_after_headers(stack.url, long_body(stack.engine, i)),
                      range(6)))
    released = assert_released_and_serving(stack, time.monotonic())
    print(f"prefill released {released:.2f} s after six clients left")


def test_abort_storm_leaves_nothing_held(stack):
    def one(i: int) -> None:
        body = {"model": stack.engine.model, "prompt": [11 + i % 50] * (200 + 40 * (i % 20)),
                "max_tokens": 20, "ignore_eos": True, "stream": True}
        if i % 3 == 0:
            leave_after_headers(stack.url, body)
            return
        with httpx.Client(timeout=120) as client:
            r = client.post(f"{stack.url}/v1/completions", json={**body, "stream": False})
            assert r.status_code == 200, r.text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(60)))
    assert_released_and_serving(stack, time.monotonic())


def hold_stream(url: str, body: dict) -> None:
    """Read the stream to its end, whatever it ends with (the decode dies under it)."""
    try:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                for _ in r.iter_lines():
                    pass
    except httpx.HTTPError:
        pass


def test_a_killed_decode_leaves_the_prefill_holding_nothing(stack):
    """Last: it breaks the module's stack (its teardown stops what is left)."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # Long answers: the first holds the decode's pool for seconds and the others wait in the
        # prefill, so the kill finds both busy (with short ones a fast run had served all four
        # before the first look).
        streams = [pool.submit(hold_stream, stack.url,
                               {**long_body(stack.engine, 100 + i), "max_tokens": LONG_ANSWER})
                   for i in range(4)]
        wait_until(lambda: stack.procs["prefill"].requests_in_flight() > 0, 30,
                   "the prefill to start")
        stack.procs[stack.engine.decode].signal_group(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: prefill_idle(stack), KILL_BOUND_S, "the prefill to hold nothing")
        print(f"prefill released {time.monotonic() - killed:.2f} s after the decode was killed")
        concurrent.futures.wait(streams, 60)
