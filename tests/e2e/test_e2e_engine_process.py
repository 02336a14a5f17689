"""`--cpu-engine-process separate` behind the real frontend, aggregated, Tokens mode: the lives
of the worker and the engine process it owns.

- the engine process killed mid-stream: the stream ends with an error at once (not after the
  drain time), and the worker exits non-zero rather than serve with no engine;
- the worker killed (SIGKILL, no shutdown of its own): its engine process exits.
- SIGTERM to the worker: it drains, stops its engine process, and exits 0.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from harness.topology import Proc, Stack, wait_until
from tests.e2e.client import long_stream
from tests.support.topologies import CONTEXT_LENGTH, start_alone

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

ARGS = ("--context-length", str(CONTEXT_LENGTH), "--max-total-tokens", "65536",
        "--page-size", "16", "--cpu-engine-process", "separate")
ENDED_BOUND_S = 5.0  # a stream whose engine process died ends within this
EXIT_BOUND_S = 20.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path):
    stack = Stack(tmp_path_factory.mktemp("engine-process"), tiny_model_path)
    stack.start_frontend()
    yield stack
    stack.stop()


def start(stack: Stack, name: str, *extra: str) -> Proc:
    proc = start_alone(stack, name, *ARGS, *extra)
    stack.wait_ready(name, timeout=240)
    return proc


def engine_process(worker: Proc) -> psutil.Process:
    [child] = [c for c in psutil.Process(worker.popen.pid).children()
               if "components.engine.process" in " ".join(c.cmdline())]
    return child


def test_a_killed_engine_process_ends_the_stream_and_the_worker_exits_non_zero(stack):
    name = "ep-dies"
    worker = start(stack, name)
    child = engine_process(worker)
    result: list = []
    thread = long_stream(stack.url, name, 1800, result)
    wait_until(lambda: worker.requests_in_flight() >= 1, 60, "the stream in flight")
    child.kill()
    killed = time.monotonic()
    thread.join(ENDED_BOUND_S + 30)
    ended = time.monotonic() - killed
    code = worker.reap(EXIT_BOUND_S)
    del stack.procs[name]
    log = worker.log_text()
    [got] = result
    assert got.error is not None and got.usage is None, got  # ended, not finished
    assert ended < ENDED_BOUND_S, f"the stream ended {ended:.2f} s after the kill"
    assert code not in (0, None), log[-3000:]
    assert f"CPU engine process {child.pid} exited" in log, log[-3000:]
    print(f"stream ended {ended:.2f} s after the engine process was killed; worker exit {code}")


def test_the_engine_process_exits_when_its_worker_is_killed(stack):
    name = "worker-dies"
    worker = start(stack, name)
    child = engine_process(worker)
    worker.popen.send_signal(signal.SIGKILL)  # the worker alone: no shutdown of its own
    worker.popen.wait(EXIT_BOUND_S)
    del stack.procs[name]
    wait_until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
               EXIT_BOUND_S, "the engine process to exit")


def test_sigterm_stops_the_engine_process_and_exits_zero(stack):
    name = "ep-sigterm"
    worker = start(stack, name)
    child = engine_process(worker)
    worker.popen.send_signal(signal.SIGTERM)
    code = worker.reap(EXIT_BOUND_S + 10)
    del stack.procs[name]
    assert code == 0, worker.log_text()[-3000:]
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert f"the CPU engine process {child.pid} stopped (0)" in worker.log_text()
