"""The tests' fork of SGLang's subprocesses (tests/support/sglang_cpu/sglang_cpu_fork.py): the
start method it sets after SGLang's own launch settings, and that a child is as a spawned one
where it shows: its parent is the engine's process (where SGLang sends its SIGQUIT), its signal
handling is the default (a SIGTERM ends it; no descriptor wakes the worker's loop), though the
engine's process had an event loop handling SIGTERM when it forked, and its metrics go to the
directory SGLang named after the worker had imported prometheus_client; and a SIGTERM that comes
while the engine's process forks is handled once the fork returns, not dropped in an at-fork
hook."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil

from harness.topology import REPO, SGLANG_CPU_PATH

# Loaded from its file: putting its folder on this process's path would also expose the
# stand-ins there (sgl_kernel, torchvision) to every other test in the process.
_SPEC = importlib.util.spec_from_file_location("sglang_cpu_fork",
                                               SGLANG_CPU_PATH / "sglang_cpu_fork.py")
fork = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fork)

# The engine, as the worker runs it: SGLang's launch (`_set_envs_and_config` sets spawn and the
# metrics directory), patched, called from a running event loop that handles SIGTERM, in a
# process that imported prometheus_client; then a child that reports what it sees and waits to
# be signalled.
ENGINE = """
import asyncio, json, multiprocessing as mp, os, signal, sys, tempfile
import prometheus_client
import sglang_cpu_fork
from tests.unit.test_sglang_cpu_fork import report

def set_envs(server_args):
    mp.set_start_method("spawn", force=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()

async def main():
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)
    launch = type(sys)("engine")
    launch._set_envs_and_config = set_envs
    sglang_cpu_fork.patch_engine(launch)
    launch._set_envs_and_config(None)
    reader, writer = mp.Pipe(duplex=False)
    child = mp.Process(target=report, args=(writer,))
    child.start()
    seen = reader.recv()
    os.kill(child.pid, signal.SIGTERM)
    child.join(30)
    return {"engine": os.getpid(), "method": mp.get_start_method(), "exit": child.exitcode,
            **seen}

print(json.dumps(asyncio.run(main())))
"""


def report(conn) -> None:  # runs in the forked child
    from prometheus_client import Counter, values

    Counter("forked_total", "a scheduler's metric").inc()
    conn.send({"parent": psutil.Process().parent().pid, "ppid": os.getppid(),
               "value_class": values.ValueClass.__name__,
               "metric_files": os.listdir(os.environ["PROMETHEUS_MULTIPROC_DIR"]),
               "sigterm": str(signal.getsignal(signal.SIGTERM)),
               "blocked": sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
               "wakeup_fd": signal.set_wakeup_fd(-1)})
    signal.sigtimedwait([], 30)  # the engine's SIGTERM ends the process first (bounded)


# The worker's startup handler raises on SIGTERM; here the signal comes during the fork itself
# (from an at-fork hook in the parent, where logging has one too).
SIGNALLED_FORK = """
import json, multiprocessing as mp, os, signal, sys, time
import psutil
import sglang_cpu_fork

class Stop(BaseException):
    pass

def stop(signum, frame):
    raise Stop()

signal.signal(signal.SIGTERM, stop)
launch = type(sys)("engine")
launch._set_envs_and_config = lambda server_args: None
sglang_cpu_fork.patch_engine(launch)
launch._set_envs_and_config(None)
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGTERM))
try:
    mp.Process(target=time.sleep, args=(30,)).start()
    seen = "lost"
except Stop:
    seen = "stopped"
for child in psutil.Process().children():
    child.kill()
print(json.dumps({"signal": seen}))
"""


def run_engine(script: str = ENGINE, **env: str) -> dict:
    path = os.pathsep.join([str(SGLANG_CPU_PATH), str(REPO)])
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": path, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_engines_children_are_forked_with_the_engine_as_parent_and_default_signals():
    seen = run_engine(TEST_SGLANG_FORK="1")
    assert seen["method"] == "fork"
    assert seen["ppid"] == seen["parent"] == seen["engine"]  # what SGLang signals
    assert seen["sigterm"] == str(signal.SIG_DFL)
    assert not {"SIGTERM", "SIGINT"} & set(seen["blocked"])  # held off only in the parent
    assert seen["wakeup_fd"] == -1  # the loop's descriptor is not the child's
    assert seen["exit"] == -signal.SIGTERM
    assert seen["value_class"] == "MmapedValue"  # not the in-memory one the worker imported
    assert seen["metric_files"]  # where the worker's collector reads them


def test_a_sigterm_while_the_engine_forks_is_handled_after_the_fork_not_dropped():
    assert run_engine(SIGNALLED_FORK) == {"signal": "stopped"}


def test_the_patch_keeps_sglangs_launch_and_sets_fork_after_it():
    calls = []
    launch = SimpleNamespace(_set_envs_and_config=calls.append)
    fork.patch_engine(launch)
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        launch._set_envs_and_config("server_args")
        assert calls == ["server_args"]
        assert multiprocessing.get_start_method() == "fork"
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert Path(fork.__file__).parent == SGLANG_CPU_PATH
