"""The tests' forkserver for SGLang's subprocesses
(tests/support/sglang_cpu/sglang_cpu_forkserver.py): the start method it sets, and that a
child's `psutil.Process().parent()` is the engine's process, where SGLang sends its SIGQUIT,
as under `spawn`."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil

from harness.topology import REPO, SGLANG_CPU_PATH

# Loaded from its file: putting its folder on this process's path would also expose the
# stand-ins there (sgl_kernel, torchvision) to every other test in the process.
_SPEC = importlib.util.spec_from_file_location("sglang_cpu_forkserver",
                                               SGLANG_CPU_PATH / "sglang_cpu_forkserver.py")
forkserver = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(forkserver)

# The engine: SGLang's launch (`_set_envs_and_config` sets spawn), patched, then a child from the
# forkserver that reports what it sees. psutil is the forkserver's preload here instead of
# SGLang's modules, which take seconds to import.
ENGINE = """
import json, multiprocessing as mp, sys
import sglang_cpu_forkserver as forkserver
from tests.unit.test_sglang_cpu_forkserver import report
launch = type(sys)("engine")
launch._set_envs_and_config = lambda server_args: mp.set_start_method("spawn", force=True)
forkserver.patch_engine(launch)
launch._set_envs_and_config(None)
method = mp.get_start_method()
mp.set_forkserver_preload(["psutil"])
reader, writer = mp.Pipe(duplex=False)
child = mp.Process(target=report, args=(writer,))
child.start()
seen = reader.recv()
child.join(30)
print(json.dumps({"engine": __import__("os").getpid(), "method": method, **seen}))
"""


def report(conn) -> None:  # runs in the forkserver's child
    me = psutil.Process()
    conn.send({"parent": me.parent().pid, "ppid": os.getppid(),
               "server_parent": psutil.Process(os.getppid()).parent().pid})


def run_engine(**env: str) -> dict:
    path = os.pathsep.join([str(SGLANG_CPU_PATH), str(REPO)])
    out = subprocess.run([sys.executable, "-c", ENGINE], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": path, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_engines_children_start_from_a_forkserver_and_see_the_engine_as_their_parent():
    seen = run_engine(TEST_SGLANG_FORKSERVER="1")
    assert seen["method"] == "forkserver"
    assert seen["ppid"] != seen["engine"]  # really the forkserver's child
    assert seen["parent"] == seen["engine"]  # what SGLang signals
    assert seen["server_parent"] == seen["engine"]  # the forkserver's own parent, unchanged


def test_the_patch_keeps_sglangs_launch_and_sets_the_forkserver_after_it():
    calls = []
    launch = SimpleNamespace(_set_envs_and_config=calls.append)
    forkserver.patch_engine(launch)
    before = multiprocessing.get_start_method(allow_none=True)
    try:
        launch._set_envs_and_config("server_args")
        assert calls == ["server_args"]
        assert multiprocessing.get_start_method() == "forkserver"
        assert os.environ["TEST_SGLANG_ENGINE_PID"] == str(os.getpid())
    finally:
        multiprocessing.set_start_method(before, force=True)
        os.environ.pop("TEST_SGLANG_ENGINE_PID", None)


def test_a_process_that_is_not_an_engines_forkserver_is_left_alone(monkeypatch):
    server = [sys.executable, "-B", "-c", "from multiprocessing.forkserver import main; main()"]
    monkeypatch.setattr(sys, "orig_argv", server)
    monkeypatch.setenv("TEST_SGLANG_ENGINE_PID", str(os.getpid()))  # we are not our own child
    assert not forkserver.is_engines_forkserver()
    monkeypatch.setenv("TEST_SGLANG_ENGINE_PID", str(os.getppid()))
    assert forkserver.is_engines_forkserver()
    # Another child of the engine (the worker's attached processes inherit the variable)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "components"])
    assert not forkserver.is_engines_forkserver()
    assert Path(forkserver.__file__).parent == SGLANG_CPU_PATH
