"""``--tokenizer-worker-num N``: N processes serve one engine (SGLang's flag and semantics).

The process started by the operator builds the engine (its schedule/forward loop, KV pool,
NIXL) and serves the Dynamo endpoint as worker 0; it starts N - 1 more processes with the same
command line, each of which attaches to that engine (``Engine.attach_tokenizer_worker``, SGLang's
or the CPU engine's) and serves the same endpoint with its own request handling, chat templating,
tokenization and detokenization, so that per-request Python work is spread over N processes.
Attached processes watch the engine process: when it exits they end the requests they hold at
once and stop (Linux's parent-death SIGTERM starts that too); the engine process aborts the
requests of one that exits (each process prefixes its rids with its pid: handlers/core/live.py).
Each serves its own system port when the engine process has one (a free port; Dynamo's model card is served from it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

from components.engine.process.serve import exit_with_parent
from components.worker.hosts import free_system_port

logger = logging.getLogger(__name__)

ENGINE_PID_ENV = "DYN_SGLANG_ENGINE_PID"  # set only in the processes this module starts
STOP_TIMEOUT_S = 30.0


def engine_pid() -> int | None:
    """The engine process this one attaches to, or None when it owns its engine."""
    value = os.environ.get(ENGINE_PID_ENV)
    return int(value) if value else None


def watch_exit(loop: asyncio.AbstractEventLoop, pid: int, on_exit: Callable[[], None]) -> None:
    """Call `on_exit()` on the loop as soon as process `pid` has exited (its pidfd becomes
    readable then: no polling). Linux's parent-death signal is no such proof: it comes when the
    thread that started this process exits, and a killed process's threads exit one by one."""
    fd = os.pidfd_open(pid)

    def exited() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        on_exit()

    loop.add_reader(fd, exited)


def exit_with_engine() -> None:
    """Ask Linux for SIGTERM when the engine process (our parent) exits, and check it has not
    already: the normal shutdown path then unregisters and ends live requests."""
    exit_with_parent(engine_pid(), "the engine process exited before this tokenizer worker "
                                   "started")


class TokenizerWorkers:
    """The N - 1 attached processes of an engine process."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    @classmethod
    def start(cls, count: int, argv: Sequence[str]) -> "TokenizerWorkers":
        env = dict(os.environ, **{ENGINE_PID_ENV: str(os.getpid())})
        procs = []
        for _ in range(count - 1):
            if "DYN_SYSTEM_PORT" in env:  # each process serves its own system port
                env["DYN_SYSTEM_PORT"] = str(free_system_port(env.get("DYN_SYSTEM_HOST",
                                                                      "127.0.0.1")))
            procs.append(subprocess.Popen([sys.executable, "-m", "components", *argv], env=env))
        logger.info("started %d tokenizer worker processes: %s", len(procs),
                    [p.pid for p in procs])
        return cls(procs)

    def watch(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[int], None]) -> None:
        """Call `on_exit(pid)` on the loop as soon as an attached process exits."""
        for proc in self.procs:
            watch_exit(loop, proc.pid, lambda proc=proc: self._exited(proc, on_exit))

    @staticmethod
    def _exited(proc: subprocess.Popen, on_exit: Callable[[int], None]) -> None:
        code = proc.poll()
        (logger.warning if code else logger.info)("tokenizer worker %d exited (%s)", proc.pid, code)
        on_exit(proc.pid)

    def terminate(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (they unregister and drain, while this process's engine still runs), then
        SIGKILL for any still running after ``timeout``."""
        self.terminate()
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.error("tokenizer worker %d did not stop within %.0fs; killing it",
                             p.pid, timeout)
                p.kill()
                p.wait(timeout)
