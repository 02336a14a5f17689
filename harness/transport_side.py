"""One side of a KV transfer for the tests: a KVTransport over a small KVPool with known data.

Used in the test process and, in a child process, by ``harness/transport_peer.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from components.engine.kv.pool import KVPool, PageRun
from components.engine.disagg.transport import (
    KVArrived,
    KVTransport,
    RoomReleased,
    TransferDone,
    TransferFailed,
)

LAYERS, KV_HEADS, HEAD_DIM, PAGES, PAGE_SIZE = 2, 2, 16, 128, 16
HELD = 7.0  # what a decode side holds in the tokens it does not register


def expected_kv(room: int, tokens: int) -> torch.Tensor:
    """The KV the prefill side holds for ``room``: deterministic in the room number."""
    gen = torch.Generator().manual_seed(room % (2**63))
    return torch.randn((LAYERS, 2, KV_HEADS, tokens, HEAD_DIM), generator=gen)


class TransportSide:
    """One side: pool + transport + the pages each room holds, freed per the event contract."""

    def __init__(self, role: str, bootstrap_timeout: float, transfer_timeout: float) -> None:
        self.pool = KVPool(LAYERS, KV_HEADS, HEAD_DIM, PAGES, PAGE_SIZE, torch.float32)
        self.transport = KVTransport(self.pool.storage, role, "127.0.0.1", None,
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
        self.transport.add_prefill(room, runs, first_token, f"rid-{room}", tokens=tokens)

    def add_decode(self, room: int, host: str, port: int, tokens: int, skip: int = 0) -> None:
        """``skip``: the first tokens this side already holds (filled with ``HELD``): it
        registers only the rest."""
        self._take(room, tokens)
        self._region(room).zero_()
        self._region(room)[:, :, :, :skip] = HELD
        run, _ = self.held[room]
        self.transport.add_decode(room, host, port, self.pool.token_runs(run, tokens, skip),
                                  f"rid-{room}", skip)

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


def poll_until(sides: Sequence[TransportSide], pred: Callable[[dict], bool],
               timeout: float) -> dict:
    """Poll every side until one of them has an event matching ``pred``; take it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for side in sides:
            side.poll(0.005)
            for ev in list(side.events):
                if pred(ev):
                    side.events.remove(ev)
                    return ev
    raise TimeoutError(f"no matching event within {timeout} s: {[s.events for s in sides]}")
