"""`--cpu-engine-process`: the flag, its refusal next to `--tokenizer-worker-num`, and what the
worker does when the engine process it owns exits under it (ends requests, stops, exits 1) or
when its own shutdown stopped it (nothing)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from components.backends import cpu_flags
from components.backends.cpu import CpuBackend
from components.worker.flags.config import parse_args
from components.worker.lifecycle.shutdown import StopSignals, watch_engine_process
from tests.support.handler_fakes import wait_until

MODEL = ["--model-path", "/models/tiny"]


def test_in_process_is_the_default_and_leaves_the_engine_args_alone():
    assert cpu_flags.ENGINE_PROCESS_KEY not in dict(parse_args(MODEL).engine_args)
    assert cpu_flags.ENGINE_PROCESS_KEY not in dict(
        parse_args([*MODEL, "--cpu-engine-process", "in-process"]).engine_args)


def test_separate_is_passed_to_build():
    args = dict(parse_args([*MODEL, "--cpu-engine-process", "separate"]).engine_args)
    assert args[cpu_flags.ENGINE_PROCESS_KEY] == cpu_flags.SEPARATE


@pytest.mark.parametrize("flags", [["--tokenizer-worker-num", "2"], ["--gateway-workers", "2"]])
def test_separate_with_tokenizer_workers_is_refused_at_parse_time(flags):
    with pytest.raises(SystemExit, match="cannot be combined with --tokenizer-worker-num"):
        parse_args([*MODEL, "--cpu-engine-process", "separate", *flags])


class FakeRemote:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.engine_process = proc
        self.closed = False
        self.ended = 0

    def end_all(self) -> int:
        self.ended += 1
        return 2


async def test_an_engine_process_that_exits_under_the_worker_stops_it_non_zero():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    calls: list[str] = []
    engine = FakeRemote(proc)

    class Worker:
        def orphan(self) -> None:  # Worker.orphan -> backend.end_orphaned_requests
            calls.append(f"orphan:{CpuBackend().end_orphaned_requests(engine, 'gone')}")

        async def stop(self) -> None:
            calls.append("stop")

    signals = StopSignals(asyncio.ensure_future(asyncio.sleep(0)), workers=None)
    signals.worker = Worker()
    watch_engine_process(asyncio.get_running_loop(), engine, signals)
    await asyncio.wait_for(wait_until(lambda: calls == ["orphan:2", "stop"]), 10)
    assert signals.engine_lost and engine.ended == 1


async def test_the_exit_the_worker_asked_for_is_not_a_loss():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = FakeRemote(proc)
    startup = asyncio.ensure_future(asyncio.Event().wait())
    signals = StopSignals(startup, workers=None)
    watch_engine_process(asyncio.get_running_loop(), engine, signals)
    engine.closed = True  # RemoteCpuEngine.shutdown
    proc.terminate()
    proc.wait(10)
    await asyncio.sleep(0.05)  # a window for the pidfd callback to run; not a synchronization
    assert not signals.engine_lost and not startup.done()
    startup.cancel()
