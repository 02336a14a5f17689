"""Side-channel fuzz (issue 9): hostile peers throw random and adversarial messages at a live
prefill transport while a real decode keeps transferring bit-exact KV, and every per-peer table
of the prefill stays within its cap.

`make test` runs a fixed-seed sample of 8 s; `make fuzz` runs seeds from FUZZ_SEED on, for
FUZZ_DURATION_S seconds in all. Caps are lowered here so floods reach them quickly.
"""

from __future__ import annotations

import os
import random
import time

import msgspec
import pytest

from components.engine.disagg.transport import peers, prefill_side
from harness.transport_side import TransportSide
from protocol.kv_side_channel import MAX_MESSAGE_BYTES, Abort, Hello, Register
from tests.support.kv_rogue import HOST, Rogue, RogueAgent

SECONDS = float(os.environ.get("FUZZ_DURATION_S") or 8)
SEED = int(os.environ.get("FUZZ_SEED", "9"))
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(SECONDS + 120)]

CAPS = {"peers": 6, "registrations": 48, "tombstones": 48}
REAL_ROOMS = 10**15  # the real decode's rooms; the rogues know them (worst case) and abort them


class Fuzzer:
    def __init__(self, rng: random.Random, pre: TransportSide, dec: TransportSide, agents: list[RogueAgent]):
        self.rng, self.pre, self.dec, self.agents = rng, pre, dec, agents
        self.port = pre.transport.bootstrap_port
        self.rogues = [Rogue(self.port) for _ in range(4)]
        self.live_rooms: list[int] = []

    def name(self) -> str:
        r = self.rng
        return r.choice([self.dec.transport.agent_name, r.choice(self.agents).name,
                         f"evil-{r.randrange(1000)}", "x" * r.randint(1, 256)])

    def runs(self) -> list[tuple[int, int]]:
        r = self.rng
        base = r.choice([self.dec.pool.data_ptr, r.choice(self.agents).pool.data_ptr(), 0, 2**62])
        return [(max(0, base + r.randrange(-4096, 1 << 20)), r.randint(1, 1 << 16))
                for _ in range(r.randint(1, 8))]

    def room(self) -> int:
        r = self.rng
        return r.choice(self.live_rooms or [1]) if r.random() < 0.3 else r.randint(1, 2**63 - 1)

    def message(self):
        r, kind = self.rng, self.rng.randrange(12)
        if kind == 0:
            return r.randbytes(r.randint(0, 512))
        if kind == 1:
            return msgspec.msgpack.encode({"type": r.choice(["hello", "register", "abort", "x"]),
                                           "room": r.choice([0, -1, 2**64 - 1, "1", None]),
                                           "agent_name": r.randbytes(8), "runs": [[1]]})
        if kind == 2:
            return Hello(agent_name=self.name(), agent_metadata=r.randbytes(r.randint(1, 600)),
                         ucx_error_handling="none")
        if kind == 3:  # the real decode's metadata under another name
            return Hello(agent_name=self.name(), agent_metadata=self.dec.transport.agent_metadata,
                         ucx_error_handling="none")
        if kind in (4, 5):  # a real agent's Hello, maybe under the real decode's name
            agent = r.choice(self.agents)
            return agent.hello(self.dec.transport.agent_name if kind == 5 else None)
        if kind in (6, 7, 8):
            return Register(room=self.room(), agent_name=self.name(), runs=self.runs())
        if kind == 9:
            return Abort(room=self.room(), agent_name=self.name(), message="fuzz")
        if kind == 10:  # a flood of registrations that fit the agent's pool
            agent = r.choice(self.agents)
            return [Register(room=r.randint(1, 2**63 - 1), agent_name=agent.name,
                             runs=[(agent.pool.data_ptr(), 64)]) for _ in range(64)]
        return b"\x00" * (MAX_MESSAGE_BYTES + 1) if r.random() < 0.1 else [b"a", b"b", b"c"]

    def step(self) -> None:
        r = self.rng
        if r.random() < 0.05:  # a connection goes; another comes
            self.rogues.pop(r.randrange(len(self.rogues))).close()
            self.rogues.append(Rogue(self.port))
        rogue, msg = r.choice(self.rogues), self.message()
        if isinstance(msg, list) and msg and isinstance(msg[0], bytes):
            rogue.sock.send_multipart(msg)
        else:
            for m in msg if isinstance(msg, list) else [msg]:
                rogue.send(m)
        rogue.drain()
        rogue.replies.clear()
        self.pre.poll(0)

    def close(self) -> None:
        for rogue in self.rogues:
            rogue.close()


def real_transfer(pre: TransportSide, dec: TransportSide, room: int, fuzz: Fuzzer) -> None:
    tokens = 1 + room % 200
    fuzz.live_rooms.append(room)
    dec.add_decode(room, HOST, pre.transport.bootstrap_port, tokens)
    for _ in range(5):  # the rogues keep talking while the room is live
        fuzz.step()
    pre.add_prefill(room, tokens, first_token=room % 1000)
    deadline = time.monotonic() + 10
    got: dict[str, dict] = {}
    while len(got) < 2:
        assert time.monotonic() < deadline, f"room {room} did not transfer: {got}"
        fuzz.step()
        for h, want in ((dec, "arrived"), (pre, "done")):
            h.poll(0.002)
            for ev in [e for e in h.events if e.get("room") == room]:
                h.events.remove(ev)
                assert ev["event"] == want, ev
                got[want] = ev
    assert got["arrived"]["first_token"] == room % 1000
    assert dec.check(room), f"room {room}: KV differs from what prefill held"
    dec.free(room)
    fuzz.live_rooms.remove(room)


def assert_bounded(pre: TransportSide) -> None:
    counters = pre.transport.counters
    for table, cap in CAPS.items():
        assert counters[table] <= cap, counters


def run_fuzz(seed: int, seconds: float, monkeypatch) -> None:
    monkeypatch.setattr(peers, "MAX_PEERS", CAPS["peers"])
    monkeypatch.setattr(peers, "MAX_TOMBSTONES", CAPS["tombstones"])
    monkeypatch.setattr(prefill_side, "MAX_PENDING", CAPS["registrations"])
    monkeypatch.setattr(prefill_side, "MAX_PENDING_PER_PEER", CAPS["registrations"] // 2)
    pre = TransportSide("prefill", bootstrap_timeout=5.0, transfer_timeout=5.0)
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=5.0)
    agents = [RogueAgent(f"rogue-{seed}-{i}") for i in range(CAPS["peers"] + 2)]
    fuzz = Fuzzer(random.Random(seed), pre, dec, agents)
    try:
        real_transfer(pre, dec, REAL_ROOMS, fuzz)
        end, room = time.monotonic() + seconds, REAL_ROOMS + 1
        while time.monotonic() < end:
            for _ in range(40):
                fuzz.step()
            assert_bounded(pre)
            real_transfer(pre, dec, room, fuzz)
            room += 1
        assert room > REAL_ROOMS + 1, "the sample ran no real transfer under fuzz"
        assert pre.pool.pages_in_use == 0 and dec.pool.pages_in_use == 0
        assert pre.transport.counters["peers"] >= 1  # the real decode stayed known
    finally:
        fuzz.close()
        for agent in agents:
            agent.close()
        pre.close()
        dec.close()


def test_side_channel_fuzz(monkeypatch):
    end, seed = time.monotonic() + SECONDS, SEED
    while True:  # one minute per seed, so a failure names a seed that reproduces it quickly
        print(f"side-channel fuzz: seed {seed}")
        run_fuzz(seed, min(60.0, max(1.0, end - time.monotonic())), monkeypatch)
        seed += 1
        if time.monotonic() >= end:
            break
