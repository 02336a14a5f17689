"""A KV transport side in a child process: the far end of the cross-process transport tests.

Server: ``python -m harness.transport_peer --role prefill|decode`` sends
``{"ready": true, "port": <bootstrap port>}``, then runs the commands it reads (``add_prefill``,
``add_decode``, ``abort``, ``check``, ``free``, ``stats``; one reply each) and forwards its
transport's events (``done``, ``arrived``, ``failed``, ``released``) until its input ends.

Client: ``Peer`` (synchronous), on ``harness.child.ChildProcess``.
"""

from __future__ import annotations

import argparse
import queue
import time
from collections.abc import Callable

import torch

from harness.child import ChildProcess, Message, ParentChannel, cpu_seconds
from harness.transport_side import TransportSide

MODULE = "harness.transport_peer"
REPLIES = ("ok", "check", "stats")


# ---- server side -------------------------------------------------------------------------------
def _handle(side: TransportSide, cmd: Message) -> Message:
    op = cmd["op"]
    if op == "add_prefill":
        side.add_prefill(cmd["room"], cmd["tokens"], cmd["first_token"])
    elif op == "add_decode":
        side.add_decode(cmd["room"], cmd["host"], cmd["port"], cmd["tokens"])
    elif op == "abort":
        side.transport.abort(cmd["room"], cmd.get("message", "Aborted"))
    elif op == "check":
        return {"event": "check", "room": cmd["room"], "equal": side.check(cmd["room"])}
    elif op == "free":
        side.free(cmd["room"])
    elif op == "stats":
        return {"event": "stats", "pages_in_use": side.pool.pages_in_use,
                "busy": side.transport.busy}
    else:
        raise ValueError(f"unknown op {op!r}")
    return {"event": "ok", "op": op, "room": cmd.get("room")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a KV transport side driven by JSON lines")
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument("--bootstrap-timeout", type=float, default=5.0)
    parser.add_argument("--transfer-timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    channel = ParentChannel()
    torch.set_num_threads(1)
    side = TransportSide(args.role, args.bootstrap_timeout, args.transfer_timeout)
    channel.send({"ready": True, "port": side.transport.bootstrap_port})
    # One thread: the transport progresses only while polled, so commands are read between polls
    # (a short poll while a room is pending, a longer one when idle).
    while not channel.closed:
        for cmd in channel.read_commands():
            channel.send(_handle(side, cmd))
        for ev in side.poll(0.002 if side.transport.busy else 0.02):
            channel.send(ev)
    side.close()


# ---- client side -------------------------------------------------------------------------------
class Peer:
    """A ``TransportSide`` in a child process; the caller polls its own side while it waits."""

    def __init__(self, role: str, bootstrap_timeout: float = 5.0,
                 transfer_timeout: float = 5.0) -> None:
        self._lines: queue.Queue[Message | None] = queue.Queue()
        self.seen: list[Message] = []
        self._child = ChildProcess.start(
            MODULE, ["--role", role, "--bootstrap-timeout", str(bootstrap_timeout),
                     "--transfer-timeout", str(transfer_timeout)], self._lines.put)
        self.port: int = self._child.hello["port"]

    def send(self, **cmd) -> None:
        self._child.send(cmd)

    def wait(self, pred: Callable[[Message], bool], timeout: float,
             drive: TransportSide | None = None) -> Message:
        """First event (past or new) matching ``pred``; polls ``drive`` meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            for ev in self.seen:
                if pred(ev):
                    self.seen.remove(ev)
                    return ev
            if drive is not None:
                drive.poll(0.005)
            try:
                msg = self._lines.get(timeout=0 if drive else 0.05)
            except queue.Empty:
                pass
            else:
                if msg is None:
                    raise ConnectionError(f"the peer process exited; seen {self.seen}")
                self.seen.append(msg)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no matching peer event within {timeout} s; seen {self.seen}")

    def request(self, drive: TransportSide | None = None, **cmd) -> Message:
        self.send(**cmd)
        return self.wait(lambda e: e["event"] in REPLIES, 10, drive)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self._child.pid)

    def kill(self) -> None:
        self._child.kill()

    def stop(self) -> None:
        self._child.close()


if __name__ == "__main__":
    main()
