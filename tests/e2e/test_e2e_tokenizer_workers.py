"""`--tokenizer-worker-num 2` behind the real frontend, Text mode (the workers tokenize), on the
CPU engine and on `sglang.Engine`.

One engine process and one attached process serve `tiny-tw`; the frontend spreads requests over
both instances. Checked: output equal to a plain aggregated worker's, both processes registered
and doing work, a 400 through either, client disconnects and a killed attached process leaving
the engine's KV pool empty, and SIGTERM stopping both processes cleanly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from collections.abc import Iterator

import httpx
import pytest

from harness.topology import Stack, wait_until
from harness.worker_metrics import PREFIX, attached_pids, scrape, system_port_of
from tests.e2e.client import chat, error_message, leave_mid_stream, post, stream, user
from tests.support.topologies import AGG, ENGINE_ARGS, SGLANG, SGLANG_ENGINE_ARGS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TW = "tiny-tw"
SETTLE_S = 15.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path):
    stack = Stack(tmp_path_factory.mktemp("tokworkers"), tiny_model_path)
    try:
        stack.start_frontend()
        start_tw(stack)
        stack.start_worker("agg", "null", AGG, *ENGINE_ARGS, "--endpoint",
                           "dyn://dynamo.agg.generate", skip_tokenizer_init=False)
        stack.wait_ready(TW, AGG)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    yield stack
    stack.stop()


def start_tw(stack: Stack) -> None:
    before = ready_lines(stack)
    stack.start_worker("tw", "null", TW, *ENGINE_ARGS, "--tokenizer-worker-num", "2",
                       "--endpoint", "dyn://dynamo.tw.generate", skip_tokenizer_init=False)
    stack.wait_ready(TW)
    # Both processes log to the same file; each says it is ready once it serves and registered.
    wait_until(lambda: ready_lines(stack) - before == 2, 60, "both tw processes ready")


def ready_lines(stack: Stack) -> int:
    proc = stack.procs.get("tw")
    return proc.log_text().count("worker ready: agg serving") if proc else 0


def attached_pid(stack: Stack) -> int:
    attached = attached_pids(stack.procs["tw"].popen.pid)
    assert len(attached) == 1, attached
    return attached[0]


def pages_settle_to_zero(stack: Stack) -> None:
    wait_until(lambda: stack.procs["tw"].kv_pages_in_use() == 0, SETTLE_S, "tw pages back to 0")


def body(model: str, content: str, **extra) -> dict:
    return {"model": model, "messages": user(content), "max_tokens": 12, "temperature": 0.0,
            **extra}


def served(port: int) -> float:
    """Successful requests a process answered: its own `/metrics`
    (components/worker/metrics/worker_metrics.py)."""
    return scrape(port)[(PREFIX + "requests_total", "success")]


def test_outputs_equal_a_plain_worker_and_both_processes_serve(stack):
    ports = (stack.procs["tw"].system_port, system_port_of(attached_pid(stack)))
    before = [served(port) for port in ports]
    with httpx.Client(timeout=60) as http:
        for i in range(6):  # the frontend spreads these over both instances
            prompt = f"tell me about number {i}"
            want = chat(http, stack.url, body(AGG, prompt))
            got = chat(http, stack.url, body(TW, prompt))
            assert got["choices"][0]["message"]["content"] == \
                want["choices"][0]["message"]["content"]
            assert got["usage"] == want["usage"]
            streamed = stream(http, stack.url, "chat/completions", body(TW, prompt))
            assert streamed.text == want["choices"][0]["message"]["content"]
            assert streamed.usage["completion_tokens"] == want["usage"]["completion_tokens"]
    # Each process answered a share of the 12 requests (its own handler, template, tokenizer).
    after = [served(port) for port in ports]
    assert all(a > b for a, b in zip(after, before)), (before, after)
    assert sum(after) - sum(before) == 12
    pages_settle_to_zero(stack)


def test_bad_request_is_a_400_from_either_process(stack):
    with httpx.Client(timeout=60) as http:
        for _ in range(4):
            r = post(http, stack.url, "chat/completions", body(TW, "hi", max_tokens=100000))
            assert r.status_code == 400
            assert "100000" in error_message(r)


def test_disconnects_free_the_engines_pages(stack):
    long = body(TW, "a long answer please", max_tokens=1500, ignore_eos=True, stream=True)
    for _ in range(4):  # both processes get some
        assert leave_mid_stream(stack.url, long) >= 3
    pages_settle_to_zero(stack)


def first_event(response: httpx.Response) -> Iterator[str]:
    """Read up to the first SSE event. Keep the returned iterator while the stream should stay
    open: a line iterator dropped mid-way closes the connection (a client disconnect)."""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data:"):
            break
    return lines


def test_sigterm_stops_both_processes(stack):
    proc = stack.procs["tw"]
    child = attached_pid(stack)
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(60) == 0
    wait_until(lambda: not os.path.exists(f"/proc/{child}"), 10.0, "the attached process gone")


def test_a_killed_attached_process_frees_its_requests_pages(stack):
    start_tw(stack)  # the previous test stopped it
    long = {**body(TW, "a long answer please", max_tokens=1900, ignore_eos=True), "stream": True}
    url = f"{stack.url}/v1/chat/completions"
    # Two streams at once: the frontend's round robin puts one on each process.
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        with a.stream("POST", url, json=long) as ra, b.stream("POST", url, json=long) as rb:
            held = first_event(ra), first_event(rb)
            engine = stack.procs["tw"]
            wait_until(lambda: engine.requests_in_flight() == 2, 10, "both in the engine")
            os.kill(attached_pid(stack), signal.SIGKILL)
            # Neither stream was closed: only the kill can have ended the killed process's.
            wait_until(lambda: engine.requests_in_flight() == 1, 5.0, "its request ended")
            del held
    # Neither request could have finished its 1,900 tokens by now: the engine freed the killed
    # process's request when it saw the process gone, and the other one on the disconnect.
    wait_until(lambda: stack.procs["tw"].kv_pages_in_use() == 0, 5.0, "tw pages back to 0")
    assert stack.procs["tw"].alive()


def start_sglang_tw(stack: Stack, name: str = "sglang") -> None:
    ready = "worker ready: agg serving"
    before = stack.procs[name].log_text().count(ready) if name in stack.procs else 0
    stack.start_worker(name, "null", SGLANG, *SGLANG_ENGINE_ARGS, "--tokenizer-worker-num", "2",
                       "--endpoint", "dyn://dynamo.sglang.generate", skip_tokenizer_init=False,
                       engine="sglang")
    stack.wait_ready(SGLANG, timeout=240)
    log = stack.procs[name].log_text  # the same file across restarts
    wait_until(lambda: log().count(ready) - before == 2, 120, "both SGLang processes ready")


@pytest.fixture(scope="module")
def sglang_stack(tmp_path_factory, tiny_model_path):
    stack = Stack(tmp_path_factory.mktemp("sglang-tw"), tiny_model_path)
    try:
        stack.start_frontend()
        start_sglang_tw(stack)
        stack.start_worker("agg", "null", AGG, *ENGINE_ARGS, "--endpoint",
                           "dyn://dynamo.agg.generate", skip_tokenizer_init=False)
        stack.wait_ready(SGLANG, AGG, timeout=240)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    yield stack
    stack.stop()


def test_sglang_engine_serves_from_two_processes(sglang_stack):
    """The same flag on `sglang.Engine` (SGLang's CPU path): the attached process is SGLang's
    `Engine.attach_tokenizer_worker`, and both answer with the CPU engine's greedy output."""
    stack = sglang_stack
    log = stack.procs["sglang"].log_text
    # SGLang's router in the engine process has both processes' TokenizerWorkers.
    assert "Router registered worker IPC" in log() and "(total: 2)" in log()
    [child] = attached_pids(stack.procs["sglang"].popen.pid)
    with httpx.Client(timeout=60) as http:
        for i in range(4):
            want = chat(http, stack.url, body(AGG, f"hello {i}", max_tokens=8))
            got = chat(http, stack.url, body(SGLANG, f"hello {i}", max_tokens=8))
            assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert os.path.exists(f"/proc/{child}")


# Waits for the streams to be in flight: not bounds the tests assert. A busy 2-core box (the
# suite runs two test processes) has taken over 10 s to get both 1,900-token streams there.
READY_S = 60.0

def long_streams_one_per_process(stack: Stack, pids: list[int],
                                 scope: contextlib.ExitStack) -> list[Iterator[str]]:
    """Two long streams in flight, one in each process (the frontend's round robin): their
    line iterators, past the first event (open until `scope` ends)."""
    long = {**body(SGLANG, "a long answer please", max_tokens=1900, ignore_eos=True),
            "stream": True}
    url = f"{stack.url}/v1/chat/completions"
    responses = [scope.enter_context(scope.enter_context(httpx.Client(timeout=60)).stream(
        "POST", url, json=long)) for _ in pids]
    lines = [first_event(r) for r in responses]
    ports = [stack.procs["sglang"].system_port] + [system_port_of(p) for p in pids[1:]]
    wait_until(lambda: [in_flight(port) for port in ports] == [1] * len(ports), READY_S,
               "one stream in each process's engine")
    return lines


def in_flight(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/engine/requests", timeout=5).json()["in_flight"])


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status goes to whoever adopted it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def scheduler_requests(stack: Stack) -> int:
    return int(stack.procs["sglang"].engine_route("requests")["scheduler"])


def test_sglang_a_killed_attached_process_requests_are_aborted_in_the_engine(sglang_stack):
    stack = sglang_stack
    engine_pid = stack.procs["sglang"].popen.pid
    [child] = attached_pids(engine_pid)
    with contextlib.ExitStack() as scope:
        held = long_streams_one_per_process(stack, [engine_pid, child], scope)
        wait_until(lambda: scheduler_requests(stack) == 2, READY_S, "both in SGLang's scheduler")
        os.kill(child, signal.SIGKILL)
        killed = time.monotonic()
        # The killed process's request leaves the scheduler; the engine process's goes on.
        wait_until(lambda: scheduler_requests(stack) == 1, 5.0, "the dead process's aborted",
                   interval=0.05)
        print(f"aborted {time.monotonic() - killed:.2f} s after the attached process died")
        assert in_flight(stack.procs["sglang"].system_port) == 1
        del held
    wait_until(lambda: scheduler_requests(stack) == 0, 10, "SGLang's scheduler empty")
    assert stack.procs["sglang"].alive()


def test_sglang_attached_process_ends_its_requests_when_the_engine_process_dies(sglang_stack):
    stack = sglang_stack
    stack.procs["sglang"].stop()  # it lost its attached process in the test before
    start_sglang_tw(stack, "sglang")
    engine_pid = stack.procs["sglang"].popen.pid
    [child] = attached_pids(engine_pid)
    with contextlib.ExitStack() as scope:
        streams = long_streams_one_per_process(stack, [engine_pid, child], scope)
        os.kill(engine_pid, signal.SIGKILL)  # SGLang's own children die with it
        killed = time.monotonic()
        lines = list(streams[1])  # the rest of the attached process's stream
        ended = time.monotonic() - killed
        assert any('"error"' in line for line in lines), lines[-3:]
        assert ended < 5.0
        wait_until(lambda: not running(child), 30, "the attached process gone")
        assert "the engine process exited: ended 1 request(s)" in stack.procs["sglang"].log_text()
        print(f"attached stream ended {ended:.2f} s after the engine process died")
