"""The engine process of ``--cpu-engine-process separate`` (``python -m components.engine.process``).

Started and owned by one worker process (``launch.py``), it builds the ``CpuEngine`` (model, KV
pool, NIXL, the bootstrap server) and serves it to that worker with ``EngineService``, so the
engine's thread no longer shares a GIL with the worker's event loop, handlers and Dynamo's
bindings. It reads its engine arguments as JSON on stdin (the KV side-channel secret stays off
the command line), writes one line on the inherited ready descriptor once it serves, and runs
until SIGTERM (its worker's shutdown) or until its worker exits (Linux's parent-death signal,
and the worker's pidfd, since that signal comes when the starting *thread* exits): then it aborts
what it runs, frees its pools and exits. It runs in its own session so that a signal to the
worker's process group (Ctrl-C, a supervisor's group kill) reaches the worker only, which drains
on this engine before it stops it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import sys

from components.engine.process.service import EngineService

logger = logging.getLogger(__name__)

READY_FD_ENV = "CPU_ENGINE_READY_FD"
PARENT_PID_ENV = "CPU_ENGINE_PARENT_PID"
READY_LINE = b"ready\n"
_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent: int, gone: str) -> None:
    """SIGTERM from Linux when `parent` (this process's parent) dies, and make sure it has not
    already; `gone` is the exit message if it has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent:
        raise SystemExit(gone)


def wait_for_stop(parent: int) -> str:
    """Block until SIGTERM/SIGINT or the worker's exit (no polling); what it was."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wake-up descriptor says it came
    parent_fd = os.pidfd_open(parent)
    ready, _, _ = select.select([wake_r, parent_fd], [], [])
    return "the worker exited" if parent_fd in ready else "stop signal"


def main() -> None:
    spec = json.loads(sys.stdin.read())
    logging.basicConfig(level=getattr(logging, str(spec["log_level"]).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s [engine]")
    parent = int(os.environ[PARENT_PID_ENV])
    exit_with_parent(parent, "the worker exited before its engine process started")
    from components.engine.process.engine import CpuEngine  # torch: after the cheap checks

    engine = CpuEngine(**spec["engine_kwargs"])
    service = EngineService(engine)
    service.start()
    ready_fd = int(os.environ[READY_FD_ENV])
    os.write(ready_fd, READY_LINE)
    os.close(ready_fd)
    logger.info("CPU engine process %d serving worker %d", os.getpid(), parent)
    why = wait_for_stop(parent)
    logger.info("CPU engine process stopping: %s", why)
    service.stop()  # its relays end: requests still running are aborted
    engine.shutdown()
    logger.info("CPU engine process stopped")
