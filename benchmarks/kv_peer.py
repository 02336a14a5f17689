"""The decode side of the KV transfer benchmark, in a child process (`harness/child.py`).

Server: ``python -m benchmarks.kv_peer <max tokens> [<ucx error handling> [<pool layout>]]`` holds
a KVTransport over a pool of the `small` model's geometry (UCX error handling and KVPool layout as
the parent's), sends
``{"ready": true}``, then answers each command with one line:

    {"op": "register", "room": R, "tokens": T, "port": P} -> {"registered": R}
    {"op": "report", "room": R}                            -> {"room": R, "sum": S} once the KV is in

or ``{"error": ...}``. Nothing is sent unasked, so the parent's reader thread stays blocked while
the parent times a transfer.

Client: ``DecodePeer`` (synchronous).
"""

from __future__ import annotations

import argparse
import queue

import torch

from components.engine.kv.pool import DEFAULT_LAYOUT, KVPool, PageRun
from components.engine.disagg.transport import KVArrived, KVTransport, Peering, TransferFailed
from harness.child import ChildProcess, Message, ParentChannel

MODULE = "benchmarks.kv_peer"
LAYERS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 8, 4, 64, 16  # the `small` model, fp32
HOST = "127.0.0.1"
TIMEOUT_S = 30.0  # the transport's bootstrap and transfer bounds
REPLY_TIMEOUT_S = TIMEOUT_S + 10.0  # a report waits for the transfer, bounded by TIMEOUT_S


def make_pool(max_tokens: int, layout: str = DEFAULT_LAYOUT) -> KVPool:
    return KVPool(LAYERS, KV_HEADS, HEAD_DIM, max_tokens // PAGE_SIZE, PAGE_SIZE, torch.float32,
                  layout)


def region(pool: KVPool, run: PageRun, tokens: int) -> torch.Tensor:
    start = run.start_page * PAGE_SIZE
    return pool.tensor[:, :, :, start:start + tokens]


# ---- server side -------------------------------------------------------------------------------
class _DecodeSide:
    def __init__(self, channel: ParentChannel, max_tokens: int, ucx_error_handling: str,
                 layout: str) -> None:
        self.channel = channel
        self.pool = make_pool(max_tokens, layout)
        self.transport = KVTransport(self.pool.storage, "decode", HOST, None, TIMEOUT_S, TIMEOUT_S,
                                     peering=Peering(ucx_error_handling=ucx_error_handling))
        self.held: dict[int, tuple[PageRun, int]] = {}
        self.ended: dict[int, str | None] = {}  # room -> None (arrived) or the failure
        self.asked: set[int] = set()

    def handle(self, cmd: Message) -> None:
        op, room = cmd["op"], cmd["room"]
        if op == "register":
            run = self.pool.allocate(cmd["tokens"])
            self.held[room] = (run, cmd["tokens"])
            runs = self.pool.token_runs(run, cmd["tokens"])
            self.transport.add_decode(room, HOST, cmd["port"], runs, "bench")
            self.channel.send({"registered": room})
        elif op == "report":
            self.asked.add(room)
        else:
            self.channel.send({"error": f"unknown op {op!r}"})

    def poll(self) -> None:
        # The same slice as a waiting decode engine while a room is pending; idle, a short one
        # so commands are read promptly (they arrive on stdin, not on the transport's sockets).
        for ev in self.transport.poll(0.05 if len(self.ended) < len(self.held) else 0.02):
            if isinstance(ev, KVArrived):
                self.ended[ev.room] = None
            elif isinstance(ev, TransferFailed):
                self.ended[ev.room] = ev.message
        for room in self.asked & self.ended.keys():
            self.asked.discard(room)
            self.channel.send(self._report(room, self.ended.pop(room)))

    def _report(self, room: int, failure: str | None) -> Message:
        run, tokens = self.held.pop(room)
        checksum = float(region(self.pool, run, tokens).double().sum())
        self.pool.free(run)
        return {"error": f"room {room}: {failure}"} if failure else {"room": room, "sum": checksum}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the KV benchmark's decode side, JSON lines")
    parser.add_argument("max_tokens", type=int)
    parser.add_argument("ucx_error_handling", nargs="?", default="none")
    parser.add_argument("layout", nargs="?", default=DEFAULT_LAYOUT)
    args = parser.parse_args(argv)
    channel = ParentChannel()
    torch.set_num_threads(1)
    side = _DecodeSide(channel, args.max_tokens, args.ucx_error_handling, args.layout)
    channel.send({"ready": True})
    while not channel.closed:
        for cmd in channel.read_commands():
            side.handle(cmd)
        side.poll()
    side.transport.close()


# ---- client side -------------------------------------------------------------------------------
class DecodePeer:
    """The decode side in a child process: one command, one reply, each wait bounded."""

    def __init__(self, max_tokens: int, ucx_error_handling: str = "none",
                 layout: str = DEFAULT_LAYOUT) -> None:
        self._replies: queue.Queue[Message | None] = queue.Queue()
        self._child = ChildProcess.start(MODULE, [str(max_tokens), ucx_error_handling, layout],
                                         self._replies.put)

    def call(self, **cmd) -> Message:
        self._child.send(cmd)
        try:
            reply = self._replies.get(timeout=REPLY_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"no reply from the decode peer within {REPLY_TIMEOUT_S} s "
                               f"to {cmd}") from None
        if reply is None:
            raise ConnectionError("the decode peer process exited (its stderr is above)")
        if "error" in reply:
            raise RuntimeError(f"decode peer: {reply['error']}")
        return reply

    def close(self) -> None:
        self._child.close()


if __name__ == "__main__":
    main()
