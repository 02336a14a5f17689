"""A short soak of the disaggregated topology (real frontend, prefill and decode workers, NIXL),
in both orchestration styles: concurrent streams with random client aborts while the prefill
worker is killed and replaced and the decode worker is stopped and replaced. Afterwards both KV
pools read 0, the prefill holds no request, every request ended within its bound, and the last
requests are served.

`make test` runs a fixed-seed sample of 40 s; `make fuzz` runs it for FUZZ_DURATION_S.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from harness.topology import Stack, wait_until
from tests.topologies import (
    DECODE_ORCHESTRATED, DISAGG, FRONTEND_ORCHESTRATED, PREFILL_WAIT_S, start_decode,
    start_prefill,
)

# `make fuzz` sets FUZZ_DURATION_S for the random phases; the soak runs that long too.
SECONDS = float(os.environ.get("FUZZ_DURATION_S") or 40)
SEED = int(os.environ.get("FUZZ_SEED", "7"))
CLIENTS = 4
# Queueing behind 4 clients + the prefill wait + 64 tokens on a loaded 2-core box.
REQUEST_BOUND_S = PREFILL_WAIT_S + 40

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(SECONDS + 300)]


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    durations: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    aborted: int = 0
    last_ok: float = 0.0

    def add(self, status: int | None, elapsed: float) -> None:
        with self.lock:
            self.durations.append(elapsed)
            if status is None:
                self.aborted += 1
            else:
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status == 200:
                    self.last_ok = time.monotonic()


def one_request(http: httpx.Client, url: str, rng: random.Random, tally: Tally) -> None:
    body = {"model": DISAGG, "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
            "max_tokens": rng.randint(1, 64), "temperature": rng.choice([0.0, 0.8]),
            "stream": True, "stream_options": {"include_usage": True}}
    stop_after = rng.choice([None, None, 0, 1, 3])  # events read before the client goes away
    t0 = time.monotonic()
    status = None
    try:
        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            status = r.status_code
            for i, _ in enumerate(r.iter_lines()):
                if stop_after is not None and i >= stop_after:
                    status = None  # the client aborts: closing the stream disconnects it
                    break
    except httpx.HTTPError:
        status = 599
    tally.add(status, time.monotonic() - t0)


def client_loop(url: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=REQUEST_BOUND_S + 30) as http:
        while time.monotonic() < until:
            one_request(http, url, rng, tally)


def restart_workers(stack: Stack, rng: random.Random, until: float) -> None:
    """Kill and replace the prefill, then stop and replace the decode, at random moments."""
    time.sleep(rng.uniform(0.2, 0.35) * SECONDS)  # the restarts are the point of this test
    stack.procs.pop("prefill").stop(timeout=0.1)  # SIGTERM, then SIGKILL at once
    start_prefill(stack, "prefill-b", skip_tokenizer_init=True, orchestrator=stack.style)
    time.sleep(rng.uniform(0.1, 0.2) * SECONDS)
    assert stack.procs.pop("decode").stop(timeout=60) == 0
    start_decode(stack, "decode-b", skip_tokenizer_init=True, orchestrator=stack.style)
    stack.wait_ready(DISAGG)


@pytest.fixture(scope="module", params=[DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED],
                ids=["decode-orch", "frontend-orch"])
def stack(start_stack, request) -> Stack:
    stack = start_stack(f"soak-{request.param}", skip_tokenizer_init=True, with_agg=False,
                        orchestrator=request.param)
    stack.style = request.param
    yield stack
    stack.stop()


def test_soak_with_aborts_and_restarts(stack):
    rng = random.Random(SEED)
    tally = Tally()
    until = time.monotonic() + SECONDS
    clients = [threading.Thread(target=client_loop, args=(stack.url, SEED + i, until, tally))
               for i in range(CLIENTS)]
    for c in clients:
        c.start()
    restart_workers(stack, rng, until)
    for c in clients:  # each sends until `until`, then ends its last request within its bound
        c.join(max(0.0, until - time.monotonic()) + REQUEST_BOUND_S + 60)
        assert not c.is_alive(), "a client is stuck past every request bound"
    assert max(tally.durations) < REQUEST_BOUND_S, sorted(tally.durations)[-5:]
    assert tally.aborted > 0 and tally.statuses.get(200, 0) > 0, tally.statuses
    assert tally.last_ok > 0 and not set(tally.statuses) - {200, 404, 500, 503, 599}, tally
    # Served after both restarts, and nothing held anywhere.
    with httpx.Client(timeout=60) as http:
        ok = http.post(f"{stack.url}/v1/chat/completions", json={
            "model": DISAGG, "messages": [{"role": "user", "content": "after"}], "max_tokens": 4})
        assert ok.status_code == 200, ok.text
    wait_until(lambda: stack.procs["decode-b"].kv_pages_in_use() == 0
               and stack.procs["prefill-b"].kv_pages_in_use() == 0
               and stack.procs["prefill-b"].requests_in_flight() == 0, 20,
               "both pools back to 0 and no request left in the prefill")
