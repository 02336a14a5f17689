"""Stopping a worker behind the real frontend, on the CPU engine and on `sglang.Engine` (SGLang's
CPU path), aggregated, Tokens mode.

- SIGTERM while the engine loads: the worker exits 0 at once having registered nothing, and
  SGLang's scheduler and detokenizer processes go with it.
- SIGTERM under a long stream: the model leaves discovery first, the stream goes on through the
  grace period and the drain time, then ends with an error event; the worker exits 0 within
  grace + drain + a few seconds.
- SIGTERM to the whole process group under a stream (a terminal's Ctrl-C, a group kill), on
  SGLang: its scheduler and detokenizer exit at once and SGLang's watchdog says so with a SIGQUIT;
  the worker ends the stream then and still exits 0 (SGLang's own handler would SIGKILL it).
"""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest

from components.worker.lifecycle.shutdown import ENGINE_EXIT_WHILE_STOPPING
from harness.topology import Stack, wait_until
from tests.e2e.client import long_stream
from tests.support.topologies import ENGINE_ARGS, SGLANG_ENGINE_ARGS, start_alone

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

ENGINES = {"cpu": ENGINE_ARGS, "sglang": SGLANG_ENGINE_ARGS}
GRACE_S, DRAIN_S = 1.5, 1.5
LONG = ("--context-length", "8192")  # a stream far longer than grace + drain
EXIT_BOUND_S = 20.0  # a signalled worker is gone within this (beyond grace + drain)
# uvloop's timers count from the time its loop cached at the start of an iteration, so each of
# the grace and drain waits may end up to one iteration early (seen: 8 us short of 3 s).
TIMER_SLACK_S = 0.05


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path):
    stack = Stack(tmp_path_factory.mktemp("shutdown"), tiny_model_path)
    stack.start_frontend()
    stack.wait_ready()  # the frontend answers (a worker stopped at once may beat it up)
    yield stack
    stack.stop()


def sglang_processes(pid: int) -> list[psutil.Process]:
    """SGLang's scheduler and detokenizer under the worker: they name themselves "sglang::...",
    whether spawned by the worker or forked from it (the suite's way, tests/conftest.py)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name().startswith("sglang::"):
                found.append(child)
    return found


def start(stack: Stack, engine: str, name: str, *extra: str, **env: str):
    return start_alone(stack, name, *ENGINES[engine], *extra, engine=engine, env=env)


@pytest.mark.parametrize("engine", ENGINES)
def test_sigterm_while_the_engine_loads_exits_zero_having_registered_nothing(stack, engine):
    name = f"load-{engine}"
    # SGLang's scheduler takes 60 s to load (tests/support/sglang_cpu/sitecustomize.py), so the
    # signal, sent once loading shows, lands during the load; the tiny model alone loads in about
    # a second. A plain process: forked from a zygote (harness/zygote.py), the CPU engine's
    # load is as short.
    proc = start(stack, engine, name, TEST_WORKER_ZYGOTE="0", TEST_SGLANG_SLOW_LOAD_S="60")
    wait_until(lambda: f"starting {engine} engine" in proc.log_text(), 60,
               "the engine build to begin", interval=0.02)
    children = [] if engine == "cpu" else wait_until(
        lambda: sglang_processes(proc.popen.pid), 60, "SGLang's scheduler process",
        interval=0.05)
    proc.popen.send_signal(signal.SIGTERM)  # the worker alone, as Kubernetes signals PID 1
    started = time.monotonic()
    code = proc.reap(EXIT_BOUND_S)
    took = time.monotonic() - started
    del stack.procs[name]  # stopped on purpose
    log = proc.log_text()
    assert code == 0, log[-3000:]
    assert "nothing was served" in log and "worker ready" not in log, log[-3000:]
    assert name not in stack.models()
    wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                               for c in children), 10, "SGLang's processes gone")
    print(f"{engine}: exited {took:.2f} s after SIGTERM during model load")


@pytest.mark.parametrize("engine", ENGINES)
def test_sigterm_drains_then_ends_a_long_stream_and_exits_zero(stack, engine):
    name = f"drain-{engine}"
    proc = start(stack, engine, name, *LONG, "--drain-timeout", str(DRAIN_S),
                 DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS=str(GRACE_S))
    stack.wait_ready(name, timeout=240)
    result: list = []
    thread = long_stream(stack.url, name, 8000, result)
    wait_until(lambda: proc.requests_in_flight() >= 1, 60, "the stream in flight")
    proc.popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    wait_until(lambda: name not in stack.models(), GRACE_S + DRAIN_S, "the model unregistered")
    unregistered = time.monotonic() - signalled
    assert thread.is_alive()  # unregistered first; the stream goes on meanwhile
    thread.join(GRACE_S + DRAIN_S + EXIT_BOUND_S)
    ended = time.monotonic() - signalled
    code = proc.reap(EXIT_BOUND_S)
    del stack.procs[name]
    assert code == 0, proc.log_text()[-3000:]
    [got] = result
    assert got.error is not None and got.usage is None, got  # ended, not finished
    assert GRACE_S + DRAIN_S - TIMER_SLACK_S <= ended < GRACE_S + DRAIN_S + EXIT_BOUND_S
    assert "ran out: ended 1 engine request(s)" in proc.log_text()
    print(f"{engine}: unregistered {unregistered:.2f} s, stream ended {ended:.2f} s after SIGTERM")


def test_sigterm_to_the_process_group_ends_the_stream_and_exits_zero(stack):
    name = "group-sglang"
    proc = start(stack, "sglang", name, *LONG, "--drain-timeout", "60",
                 DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS=str(GRACE_S))
    stack.wait_ready(name, timeout=240)
    result: list = []
    thread = long_stream(stack.url, name, 8000, result)
    wait_until(lambda: proc.requests_in_flight() >= 1, 60, "the stream in flight")
    proc.signal_group(signal.SIGTERM)  # the worker, SGLang's scheduler and its detokenizer
    signalled = time.monotonic()
    thread.join(EXIT_BOUND_S)
    code = proc.reap(EXIT_BOUND_S)
    took = time.monotonic() - signalled
    del stack.procs[name]
    log = proc.log_text()
    assert code == 0, log[-3000:]  # not -9 from SGLang's SIGQUIT handler
    [got] = result
    assert got.error is not None and got.usage is None, got  # ended, not finished
    assert f"{ENGINE_EXIT_WHILE_STOPPING}: ended 1 request(s)" in log, log[-3000:]
    assert took < EXIT_BOUND_S  # not the 60 s drain time: nothing was left to wait for
    print(f"sglang: exited {took:.2f} s after SIGTERM to its process group")
