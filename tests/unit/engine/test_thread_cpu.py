"""benchmarks/thread_cpu.py: per-thread CPU from /proc, grouped by role (the numbers
bench_token_cpu reports), and the engine thread's OS name that makes its group findable."""

import os
import sys
import threading
import time

import pytest

from benchmarks.thread_cpu import ENGINE_THREAD, CpuSampler
from components.engine.core.loop import _name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_each_threads_cpu_lands_in_its_group():
    burned, release = threading.Event(), threading.Event()

    def engine() -> None:
        _name_os_thread(ENGINE_THREAD)
        burn(0.15)
        burned.set()
        release.wait(10)  # stays alive until sampled: an exited thread's CPU is not counted

    sampler = CpuSampler({"me": os.getpid()})
    sampler.start()
    t = threading.Thread(target=engine)
    t.start()
    try:
        assert burned.wait(10)
        burn(0.05)  # on the main thread: the "loop" group
        groups = sampler.stop()["me"]
    finally:
        release.set()
        t.join(10)
    assert 0.14 <= groups["engine"] < 1.0
    assert groups["loop"] >= 0.04
    assert sampler.by_name["me"][ENGINE_THREAD] == groups["engine"]

