"""A short soak of the disaggregated topology (real frontend, prefill and decode workers, NIXL),
on the CPU engine in both orchestration styles and on `sglang.Engine` (SGLang's CPU path)
frontend-orchestrated: concurrent streams with random client aborts while the prefill worker is
killed and replaced and the decode worker is stopped and replaced. Afterwards no worker holds a
request (and on the CPU engine both KV pools read 0), every request ended within its bound, and
the last requests are served.

`make test` runs a fixed-seed sample of 20 s (25 s on SGLang); `make fuzz` runs every engine and
style for FUZZ_DURATION_S.
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
from tests.support.topologies import (
    DECODE_ORCHESTRATED, DISAGG, FRONTEND_ORCHESTRATED, PREFILL_WAIT_S, SGLANG, start_decode,
    start_prefill, start_sglang_decode, start_sglang_prefill, start_sglang_topology,
)

# `make fuzz` sets FUZZ_DURATION_S for the random phases; the soak runs that long too.
LONG_RUN = bool(os.environ.get("FUZZ_DURATION_S"))
SECONDS = float(os.environ.get("FUZZ_DURATION_S") or 20)
# SGLang's workers take ~10 s to replace here (CPU workers ~4 s): its sample is longer, so that
# traffic still runs once the replaced prefill serves.
SGLANG_SECONDS = SECONDS if LONG_RUN else 25.0
SEED = int(os.environ.get("FUZZ_SEED", "7"))
CLIENTS = 4
# Queueing behind 4 clients + the prefill wait + 64 tokens on a loaded 2-core box.
REQUEST_BOUND_S = PREFILL_WAIT_S + 40

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(SECONDS + 400)]


@dataclass(frozen=True)
class Topology:
    engine: str
    style: str
    model: str
    decode: str  # the decode worker's process name
    seconds: float

    def start_prefill(self, stack: Stack, name: str) -> None:
        if self.engine == "sglang":
            start_sglang_prefill(stack, name, True, self.style)
        else:
            start_prefill(stack, name, skip_tokenizer_init=True, orchestrator=self.style)

    def start_decode(self, stack: Stack, name: str) -> None:
        if self.engine == "sglang":
            start_sglang_decode(stack, name, True, self.style)
        else:
            start_decode(stack, name, skip_tokenizer_init=True, orchestrator=self.style)


TOPOLOGIES = {
    "cpu-decode-orch": Topology("cpu", DECODE_ORCHESTRATED, DISAGG, "decode", SECONDS),
    "cpu-frontend-orch": Topology("cpu", FRONTEND_ORCHESTRATED, DISAGG, "decode", SECONDS),
    "sglang-frontend-orch": Topology("sglang", FRONTEND_ORCHESTRATED, SGLANG, "sglang",
                                     SGLANG_SECONDS),
}
if LONG_RUN:
    TOPOLOGIES["sglang-decode-orch"] = Topology("sglang", DECODE_ORCHESTRATED, SGLANG, "sglang",
                                                SGLANG_SECONDS)


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


def one_request(http: httpx.Client, url: str, model: str, rng: random.Random,
                tally: Tally) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": f"soak {rng.random()}"}],
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


def client_loop(url: str, model: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=REQUEST_BOUND_S + 30) as http:
        while time.monotonic() < until:
            one_request(http, url, model, rng, tally)


def restart_workers(stack: Stack, topo: Topology, rng: random.Random) -> None:
    """Kill and replace the prefill, then stop and replace the decode, at random moments."""
    time.sleep(rng.uniform(0.2, 0.35) * topo.seconds)  # the restarts are the point of this test
    stack.procs.pop("prefill").stop(timeout=0.1)  # SIGTERM, then SIGKILL at once
    topo.start_prefill(stack, "prefill-b")
    time.sleep(rng.uniform(0.1, 0.2) * topo.seconds)
    assert stack.procs.pop(topo.decode).stop(timeout=60) == 0
    topo.start_decode(stack, "decode-b")
    stack.wait_ready(topo.model, timeout=240)


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def stack(start_stack, tmp_path_factory, tiny_model_path, request) -> Stack:
    topo = TOPOLOGIES[request.param]
    if topo.engine == "sglang":
        stack = start_sglang_topology(tmp_path_factory.mktemp(f"soak-{request.param}"),
                                      tiny_model_path, True, disaggregated=True,
                                      orchestrator=topo.style, with_agg=False)
    else:
        stack = start_stack(f"soak-{request.param}", skip_tokenizer_init=True, with_agg=False,
                            orchestrator=topo.style)
    stack.topo = topo
    yield stack
    stack.stop()


def idle(proc) -> bool:
    """No request held; on the CPU engine no KV page either (SGLang reports no page count)."""
    pages = proc.engine_route("kv_pages")["pages_in_use"]
    return proc.requests_in_flight() == 0 and not pages


def test_soak_with_aborts_and_restarts(stack):
    topo = stack.topo
    rng = random.Random(SEED)
    tally = Tally()
    until = time.monotonic() + topo.seconds
    clients = [threading.Thread(target=client_loop,
                                args=(stack.url, topo.model, SEED + i, until, tally))
               for i in range(CLIENTS)]
    for c in clients:
        c.start()
    restart_workers(stack, topo, rng)
    for c in clients:  # each sends until `until`, then ends its last request within its bound
        c.join(max(0.0, until - time.monotonic()) + REQUEST_BOUND_S + 60)
        assert not c.is_alive(), "a client is stuck past every request bound"
    assert max(tally.durations) < REQUEST_BOUND_S, sorted(tally.durations)[-5:]
    assert tally.aborted > 0 and tally.statuses.get(200, 0) > 0, tally.statuses
    assert tally.last_ok > 0 and not set(tally.statuses) - {200, 404, 500, 503, 599}, tally
    # Served after both restarts, and nothing held anywhere.
    with httpx.Client(timeout=60) as http:
        ok = http.post(f"{stack.url}/v1/chat/completions", json={
            "model": topo.model, "messages": [{"role": "user", "content": "after"}],
            "max_tokens": 4})
        assert ok.status_code == 200, ok.text
    wait_until(lambda: idle(stack.procs["decode-b"]) and idle(stack.procs["prefill-b"]), 20,
               "no request or KV page left in either worker")
