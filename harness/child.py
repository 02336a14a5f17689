"""A child process driven by JSON lines: commands on its stdin, replies and events on its stdout.

Both ends live here. The child's end (``ParentChannel``) keeps the protocol on a private copy of
stdout, because native libraries (NIXL, UCX) print to fd 1. The parent's end (``ChildProcess``)
starts ``python -m <module>`` in its own process group, waits a bounded time for the ready line and
hands every later message to a callback on a reader thread: a synchronous caller passes a queue's
``put``, an asyncio caller a function that hops onto its loop. End of input asks the child to
finish; the parent kills the whole group whatever the child did.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent  # the child runs here, so `-m harness.x` resolves
READY_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 10.0

Message = dict[str, Any]


# ---- the child's end ---------------------------------------------------------------------------
class ParentChannel:
    """Replies on a private copy of stdout; fd 1 and ``sys.stdout`` point at stderr from here on.

    Create it before anything that may print (torch, NIXL). Commands are read without blocking:
    ``read_commands`` for a polling loop, ``commands`` for an asyncio server."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._fd = sys.stdin.fileno()
        os.set_blocking(self._fd, False)
        self._buf = b""
        self.closed = False  # the parent ended our input: time to finish

    def send(self, msg: Message) -> None:
        self._out.write(json.dumps(msg) + "\n")
        self._out.flush()

    def read_commands(self) -> list[Message]:
        """The complete commands that have arrived; sets ``closed`` at end of input."""
        try:
            chunk = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.closed = True
            return []
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    async def commands(self) -> AsyncIterator[Message]:
        """Commands in order as they arrive, until end of input."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[Message | None] = asyncio.Queue()

        def on_readable() -> None:
            for cmd in self.read_commands():
                arrived.put_nowait(cmd)
            if self.closed:
                loop.remove_reader(self._fd)
                arrived.put_nowait(None)

        loop.add_reader(self._fd, on_readable)
        try:
            # Unbounded on purpose: the parent's exit closes the pipe, which ends this loop.
            while (cmd := await arrived.get()) is not None:
                yield cmd
        finally:
            loop.remove_reader(self._fd)


# ---- the parent's end --------------------------------------------------------------------------
class ChildProcess:
    """``python -m module args...`` in its own process group, with one OpenMP thread (the
    parent's engines share the same few cores). Create it with ``start``.

    Messages after the ready line go to ``deliver`` on a reader thread, in order; ``None`` last,
    when the child's stdout closes (it exited)."""

    def __init__(self, module: str, args: Sequence[str],
                 deliver: Callable[[Message | None], None]) -> None:
        self.module = module
        self.hello: Message = {}
        self._deliver = deliver
        self._first: queue.Queue[Message | None] = queue.Queue(maxsize=1)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            cwd=REPO, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self._reader = threading.Thread(target=self._read, name=f"{module} reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, module: str, args: Sequence[str], deliver: Callable[[Message | None], None],
              ready_timeout: float = READY_TIMEOUT_S) -> ChildProcess:
        """Start the child and wait for its ready line; on failure kill it and raise."""
        child = cls(module, args, deliver)
        try:
            hello = child._first.get(timeout=ready_timeout)
        except queue.Empty:
            hello = None
        if not (hello or {}).get("ready"):
            child.kill()
            code = child._proc.wait(CLOSE_TIMEOUT_S)
            raise RuntimeError(f"{module} did not get ready within {ready_timeout} s "
                               f"(exit code {code}; its stderr is above)")
        child.hello = hello
        return child

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _read(self) -> None:
        first = True
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:  # the channel carries only JSON; say so rather than die
                logger.warning("%s wrote a line that is not JSON: %.200r", self.module, line)
                continue
            if first:
                self._first.put(msg)
                first = False
            else:
                self._deliver(msg)
        if first:
            self._first.put(None)  # exited before the ready line: fail the start at once
        self._deliver(None)

    def send(self, msg: Message) -> None:
        """Raises ``BrokenPipeError`` (a ``ConnectionError``) once the child has exited."""
        self._proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self._proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL the whole group: the child and anything it started."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """End the child's input, give it ``timeout`` to finish, then kill the group. Idempotent."""
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:  # it died with our last command unread
                pass
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not exit within %.0f s of end of input; killing it",
                               self.module, timeout)
        self.kill()
        self._proc.wait(timeout)
        self._reader.join(timeout)
        if not self._reader.is_alive():
            self._proc.stdout.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
