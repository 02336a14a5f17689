"""Starting and stopping the engine process of ``--cpu-engine-process separate`` (``serve.py``),
from the worker that owns it.

Start-up is bounded and loud: the worker waits for the engine process's ready line, and an engine
process that exits first (a bad model path, a port in use) fails the worker with its exit code;
its traceback is already in the worker's log, as the child inherits the worker's stderr.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from components.engine.process.serve import PARENT_PID_ENV, READY_FD_ENV, READY_LINE

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # model load and the KV pool's NIXL registration
STOP_TIMEOUT_S = 45.0  # the service's stop (10 s) and the engine thread's join (30 s), bounded


class EngineProcessFailed(RuntimeError):
    """The engine process did not come up."""


def start_engine_process(engine_kwargs: dict[str, Any], log_level: str | None = None,
                         timeout: float = START_TIMEOUT_S) -> subprocess.Popen:
    """The engine process, serving once this returns; it logs at `log_level` (default: this
    process's)."""
    if log_level is None:
        log_level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    ready_r, ready_w = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(ready_w), PARENT_PID_ENV: str(os.getpid())})
    proc = subprocess.Popen([sys.executable, "-m", "components.engine.process"],
                            stdin=subprocess.PIPE, pass_fds=(ready_w,), env=env,
                            start_new_session=True)
    os.close(ready_w)
    logger.info("started the CPU engine process %d", proc.pid)
    try:
        proc.stdin.write(json.dumps({"engine_kwargs": engine_kwargs,
                                     "log_level": log_level}).encode())
        proc.stdin.close()
        _wait_ready(proc, ready_r, timeout)
    except BaseException:  # a failed start, or the worker told to stop while it starts
        kill_engine_process(proc)
        raise
    finally:
        os.close(ready_r)
    return proc


def _wait_ready(proc: subprocess.Popen, ready_r: int, timeout: float) -> None:
    readable, _, _ = select.select([ready_r], [], [], timeout)
    if not readable:
        raise EngineProcessFailed(f"the CPU engine process {proc.pid} was not ready within "
                                  f"{timeout:.0f}s")
    line = os.read(ready_r, len(READY_LINE))
    if line != READY_LINE:  # end of file: it exited (or closed the descriptor) first
        try:
            code = proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        raise EngineProcessFailed(f"the CPU engine process {proc.pid} exited with code {code} "
                                  "before it was ready (its error is logged above)")


def kill_engine_process(proc: subprocess.Popen) -> None:
    """An engine process that never served: nothing to drain (the OS frees its memory)."""
    proc.kill()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        logger.error("the CPU engine process %d did not exit after SIGKILL", proc.pid)


def stop_engine_process(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM (it aborts what runs, frees its pools, exits), SIGKILL after `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.error("the CPU engine process %d did not stop within %.0fs; killing it",
                     proc.pid, timeout)
        proc.kill()
        code = proc.wait(5)
    logger.info("the CPU engine process %d stopped (%s) in %.1fs", proc.pid, code,
                time.monotonic() - started)
    return code
