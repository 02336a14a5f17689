"""Test harness for the KV transport: a KVTransport over a small KVPool with known data.

Holds no tests. Used in the test process and, through
``python tests/transport_peer.py --role ...``, as a peer process driven by JSON
lines on stdin (commands) and stdout (events).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

if __name__ == "__main__":  # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.engine.kv_pool import KVPool, PageRun  # noqa: E402
from components.engine.kv_transport import (  # noqa: E402
    KVArrived,
    KVTransport,
    RoomReleased,
    TransferDone,
    TransferFailed,
)

LAYERS, KV_HEADS, HEAD_DIM, PAGES, PAGE_SIZE = 2, 2, 16, 128, 16


def expected_kv(room: int, tokens: int) -> torch.Tensor:
    """The KV the prefill side holds for ``room``: deterministic in the room number."""
    gen = torch.Generator().manual_seed(room % (2**63))
    return torch.randn((LAYERS, 2, KV_HEADS, tokens, HEAD_DIM), generator=gen)


class Harness:
    """One side: pool + transport + the pages each room holds, freed per the event contract."""

    def __init__(self, role: str, bootstrap_timeout: float, transfer_timeout: float) -> None:
        self.pool = KVPool(LAYERS, KV_HEADS, HEAD_DIM, PAGES, PAGE_SIZE, torch.float32)
        self.transport = KVTransport(self.pool.tensor, role, "127.0.0.1", None,
                                     bootstrap_timeout, transfer_timeout)
        self.role = role
        self.held: dict[int, tuple[PageRun, int]] = {}
        self.events: list[dict] = []

    def _region(self, room: int) -> torch.Tensor:
        run, tokens = self.held[room]
        start = run.start_page * PAGE_SIZE
        return self.pool.tensor[:, :, :, start:start + tokens]

    def _take(self, room: int, tokens: int) -> list[tuple[int, int]]:
        run = self.pool.allocate(tokens)
        assert run is not None, "test pool exhausted"
        self.held[room] = (run, tokens)
        return self.pool.token_runs(run, tokens)

    def add_prefill(self, room: int, tokens: int, first_token: int) -> None:
        runs = self._take(room, tokens)
        self._region(room).copy_(expected_kv(room, tokens))
        self.transport.add_prefill(room, runs, first_token, f"rid-{room}")

    def add_decode(self, room: int, host: str, port: int, tokens: int) -> None:
        runs = self._take(room, tokens)
        self._region(room).zero_()
        self.transport.add_decode(room, host, port, runs, f"rid-{room}")

    def check(self, room: int) -> bool:
        return torch.equal(self._region(room), expected_kv(room, self.held[room][1]))

    def free(self, room: int) -> None:
        run, _ = self.held.pop(room)
        self.pool.free(run)

    def poll(self, timeout_s: float) -> list[dict]:
        out = []
        for ev in self.transport.poll(timeout_s):
            if isinstance(ev, TransferDone):
                self.free(ev.room)
                out.append({"event": "done", "room": ev.room})
            elif isinstance(ev, KVArrived):
                out.append({"event": "arrived", "room": ev.room, "first_token": ev.first_token})
            elif isinstance(ev, TransferFailed):
                if self.role == "prefill" and ev.room in self.held:
                    self.free(ev.room)  # prefill: failed means no WRITE in flight
                out.append({"event": "failed", "room": ev.room, "message": ev.message})
            elif isinstance(ev, RoomReleased):
                self.free(ev.room)
                out.append({"event": "released", "room": ev.room})
        self.events.extend(out)
        return out

    def close(self) -> None:
        self.transport.close()


def _handle(h: Harness, cmd: dict) -> dict | None:
    op = cmd["op"]
    if op == "add_prefill":
        h.add_prefill(cmd["room"], cmd["tokens"], cmd["first_token"])
    elif op == "add_decode":
        h.add_decode(cmd["room"], cmd["host"], cmd["port"], cmd["tokens"])
    elif op == "abort":
        h.transport.abort(cmd["room"], cmd.get("message", "Aborted"))
    elif op == "check":
        return {"event": "check", "room": cmd["room"], "equal": h.check(cmd["room"])}
    elif op == "free":
        h.free(cmd["room"])
    elif op == "stats":
        return {"event": "stats", "pages_in_use": h.pool.pages_in_use, "busy": h.transport.busy}
    else:
        raise ValueError(f"unknown op {op!r}")
    return {"event": "ok", "op": op, "room": cmd.get("room")}


_proto = sys.stdout  # replaced in main() by a private copy of fd 1


def _emit(obj: dict) -> None:
    _proto.write(json.dumps(obj) + "\n")
    _proto.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument("--bootstrap-timeout", type=float, default=5.0)
    parser.add_argument("--transfer-timeout", type=float, default=5.0)
    args = parser.parse_args()
    # Events go to a private copy of stdout; NIXL's own logging to stdout goes to stderr.
    global _proto
    _proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    torch.set_num_threads(1)
    h = Harness(args.role, args.bootstrap_timeout, args.transfer_timeout)
    _emit({"event": "ready", "port": h.transport.bootstrap_port, "pid": os.getpid()})
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            break  # the test closed our stdin
        if chunk:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                reply = _handle(h, json.loads(line))
                if reply is not None:
                    _emit(reply)
        for ev in h.poll(0.002 if h.transport.busy else 0.02):
            _emit(ev)
    h.close()


if __name__ == "__main__":
    main()
