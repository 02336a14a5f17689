"""Exists only to start worker processes faster in tests: each forked from a preloaded interpreter.

A worker (`python -m components`) spends most of its start importing torch, transformers and, on
`--engine sglang`, SGLang: about 2 s of CPU on the CPU engine and 7 s on SGLang here, and the
suite starts some 150 workers on 2 cores. With TEST_WORKER_ZYGOTE=1 in a worker's environment
(the suite's default, tests/conftest.py; `TEST_WORKER_ZYGOTE=0 make test` starts plain
processes), the harness asks a zygote instead: a process of this module that imported those
once, single-threaded, and forks a child per worker. The child becomes what `python -m
components ARGS` would be: its own session (so its process group is its pid, as with
`start_new_session`), the worker's environment, working directory and log file as stdout and
stderr, fresh random seeds, a bare root logger, the worker's command line as its title, and the
worker's `__main__` run by `runpy`; its exit (a code, or -signal) is what the zygote reaped.
`ZygoteProcess` gives the harness the part of `subprocess.Popen` it uses.

Modules may read the environment when imported (SGLang reads some SGLANG_ variables so), so a
zygote serves only workers whose environment equals its own but for the variables read when the
worker runs (`RUNTIME_ONLY`: Dynamo's, etcd's and NATS's); any other worker gets a zygote of its
own environment, or, past `MAX_ZYGOTES`, a plain `Popen`. Anything that fails to start a zygote
falls back to `Popen` too, and so do workers with attached tokenizer processes (`PLAIN_FLAG`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

ENABLE_ENV = "TEST_WORKER_ZYGOTE"
RUNTIME_ONLY = ("DYN_", "ETCD_", "NATS_", "PYTEST_CURRENT_TEST")
MAX_ZYGOTES = 3  # per test process: each holds about 1 GB, shared with its children
READY_TIMEOUT_S = 120.0
PRELOAD = {"cpu": ["components.worker.main", "components.backends.cpu",
                   "components.engine.process.engine"],
           "sglang": ["components.worker.main", "components.backends.sglang",
                      "components.backends.sglang_engine", "sglang.srt.entrypoints.engine"]}
_WORKER = [sys.executable, "-m", "components"]
# A worker with attached tokenizer processes starts as a plain process: forked, its restart test
# (tests/e2e/test_e2e_tokenizer_workers.py) saw no stream reach the attached process when run
# with other modules (it passes alone); not understood yet.
PLAIN_FLAG = "--tokenizer-worker-num"


def _key(engine: str, env: dict[str, str]) -> tuple:
    return (engine, tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUNTIME_ONLY))))


def _ask(path: str, request: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


class ZygoteProcess:
    """A worker a zygote forked: `Popen`'s pid, args, poll, wait, send_signal, kill."""

    def __init__(self, socket_path: str, pid: int, args: list[str]) -> None:
        self._socket, self.pid, self.args = socket_path, pid, args
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = _ask(self._socket, {"op": "status", "pid": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygotes:
    def __init__(self) -> None:
        self.by_key: dict[tuple, Optional[tuple[subprocess.Popen, str]]] = {}
        self.lock = threading.Lock()
        atexit.register(self.close)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path,
              log_path: Path) -> Optional[ZygoteProcess]:
        """The worker `argv` forked from a zygote, or None where none serves it."""
        if env.get(ENABLE_ENV) != "1" or argv[:3] != _WORKER or PLAIN_FLAG in argv:
            return None
        engine = argv[argv.index("--engine") + 1] if "--engine" in argv else "cpu"
        key = _key(engine, env)
        with self.lock:  # a test may start workers from several threads
            if key not in self.by_key:
                self.by_key[key] = (self._start(engine, env, cwd)
                                    if engine in PRELOAD and len(self.by_key) < MAX_ZYGOTES
                                    else None)
            zygote = self.by_key[key]
        if zygote is None or zygote[0].poll() is not None:
            return None
        pid = _ask(zygote[1], {"op": "spawn", "args": argv[3:], "env": env, "cwd": str(cwd),
                               "log": str(log_path)})["pid"]
        return ZygoteProcess(zygote[1], pid, argv)

    def _start(self, engine: str, env: dict[str, str], cwd: Path):
        workdir = Path(tempfile.mkdtemp(prefix="zygote-"))
        path = str(workdir / "socket")
        with open(workdir / "zygote.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "harness.zygote", engine, path],
                                    cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                sys.stderr.write(f"no worker zygote: {(workdir / 'zygote.log').read_text()[-500:]}")
                shutil.rmtree(workdir, ignore_errors=True)
                return None  # the workers start as plain processes
            time.sleep(0.05)
        return proc, path

    def close(self) -> None:
        for zygote in self.by_key.values():
            if zygote is not None:
                zygote[0].kill()
                zygote[0].wait(10)
                shutil.rmtree(Path(zygote[1]).parent, ignore_errors=True)


ZYGOTES = _Zygotes()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the worker, then run it; its exit ends this process."""
    os.setsid()
    try:  # SGLang names its processes so; set before the environment changes (it moves it)
        import setproctitle

        setproctitle.setproctitle(" ".join([*_WORKER, *request["args"]]))
    except ImportError:
        pass
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()
    for module, reseed in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
        if module in sys.modules:
            reseed(sys.modules[module])
    # The preload (SGLang's engine module) gave the root logger a handler; a fresh worker
    # configures its own before it imports that module, and would log every line once.
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    sys.argv = ["components", *request["args"]]
    import runpy

    runpy.run_module("components", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _reap(exited: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exited[pid] = os.waitstatus_to_exitcode(status)


def serve(engine: str, path: str) -> None:
    """Preload, then fork a worker per request until the test process that started it is gone.
    Single-threaded, so that each fork copies a consistent process."""
    import importlib

    for module in PRELOAD[engine]:
        importlib.import_module(module)
    threads = _threads()
    if threads != 1:
        raise SystemExit(f"zygote: {threads} threads after preloading; not forking")
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # the client waits for this path
    listener.listen(16)
    exited: dict[int, int] = {}
    while os.getppid() == parent:
        _reap(exited)
        if not select.select([listener], [], [], 0.2)[0]:
            continue
        conn, _ = listener.accept()
        request = json.loads(conn.makefile("rb").readline())
        if request["op"] == "spawn":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                conn.close()
                listener.close()
                _child(request)
            reply = {"pid": pid}
        else:
            _reap(exited)
            reply = {"code": exited.get(request["pid"])}
        conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
