"""KV transport across two processes: a prefill peer process and a decode side in the test process.

Real ZMQ side channel and real NIXL (UCX) WRITEs between separate processes; plain KV pools with
known data (no model).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from tests.transport_peer import Harness

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, "transport_peer.py")
REPO = os.path.dirname(os.path.dirname(HARNESS))
HOST = "127.0.0.1"


class Peer:
    """A harness in its own process (own session), driven over stdin/stdout JSON lines."""

    def __init__(self, role: str, bootstrap_timeout: float = 5.0,
                 transfer_timeout: float = 5.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, HARNESS, "--role", role, "--bootstrap-timeout", str(bootstrap_timeout),
             "--transfer-timeout", str(transfer_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self._lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self.wait(lambda e: e["event"] == "ready", 60)
        self.port = self.ready["port"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))  # the harness writes only JSON lines here

    def send(self, **cmd) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def wait(self, pred: Callable[[dict], bool], timeout: float,
             drive: Harness | None = None) -> dict:
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
                self.seen.append(self._lines.get(timeout=0 if drive else 0.05))
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no matching peer event within {timeout} s; seen {self.seen}")

    def request(self, drive: Harness | None = None, **cmd) -> dict:
        self.send(**cmd)
        return self.wait(lambda e: e["event"] in ("ok", "check", "stats"), 10, drive)

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def drive_until(h: Harness, pred: Callable[[dict], bool], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in list(h.events):
            if pred(ev):
                h.events.remove(ev)
                return ev
        h.poll(0.01)
    raise TimeoutError(f"no matching event within {timeout} s; events {h.events}")


def transfer_room(peer: Peer, dec: Harness, room: int, tokens: int) -> None:
    dec.add_decode(room, HOST, peer.port, tokens)
    peer.request(dec, op="add_prefill", room=room, tokens=tokens, first_token=room % 1000)
    drive_until(dec, lambda e: e.get("room") == room and e["event"] == "arrived", 10)
    peer.wait(lambda e: e == {"event": "done", "room": room}, 10, dec)
    dec.free(room)


@pytest.fixture(scope="module")
def prefill_peer():
    peer = Peer("prefill", bootstrap_timeout=5.0, transfer_timeout=10.0)
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def decode_side(prefill_peer):
    dec = Harness("decode", bootstrap_timeout=5.0, transfer_timeout=10.0)
    transfer_room(prefill_peer, dec, 1, 8)  # warm-up: connection, hello, UCX wire-up
    yield dec
    dec.close()


def assert_no_pages_held(peer: Peer, dec: Harness) -> None:
    stats = peer.request(dec, op="stats")
    assert stats["pages_in_use"] == 0 and not stats["busy"]
    assert dec.pool.pages_in_use == 0 and not dec.transport.busy


def test_concurrent_rooms_arrive_bit_exact_with_either_side_first(prefill_peer, decode_side):
    peer, dec = prefill_peer, decode_side
    rooms = {101: 5, 102: 16, 103: 100, 104: 300, 105: 17, 106: 64, 107: 1, 108: 250}
    decode_first, prefill_first = list(rooms)[:4], list(rooms)[4:]
    for room in decode_first:
        dec.add_decode(room, HOST, peer.port, rooms[room])
    for room in rooms:
        peer.request(dec, op="add_prefill", room=room, tokens=rooms[room], first_token=room + 7)
    for room in prefill_first:
        dec.add_decode(room, HOST, peer.port, rooms[room])
    for room in rooms:
        ev = drive_until(dec, lambda e, r=room: e.get("room") == r and e["event"] != "released", 15)
        assert ev == {"event": "arrived", "room": room, "first_token": room + 7}
        assert dec.check(room), f"room {room}: KV differs from what prefill held"
        dec.free(room)
    for room in rooms:
        ev = peer.wait(lambda e, r=room: e.get("room") == r, 10, dec)
        assert ev == {"event": "done", "room": room}
    assert_no_pages_held(peer, dec)


def test_decode_abort_reaches_prefill(prefill_peer, decode_side):
    peer, dec = prefill_peer, decode_side
    dec.add_decode(201, HOST, peer.port, 40)
    dec.transport.abort(201, "client disconnected")
    start = time.monotonic()
    # Released on the prefill's ack, far sooner than the 10 s grace.
    assert drive_until(dec, lambda e: e.get("room") == 201, 5) == {"event": "released", "room": 201}
    assert time.monotonic() - start < 3
    peer.request(dec, op="add_prefill", room=201, tokens=40, first_token=1)
    ev = peer.wait(lambda e: e.get("room") == 201, 5, dec)
    assert ev["event"] == "failed" and "aborted by decode: client disconnected" in ev["message"]
    assert_no_pages_held(peer, dec)


def test_prefill_abort_reaches_decode(prefill_peer, decode_side):
    peer, dec = prefill_peer, decode_side
    # Decode registered before the prefill gives the room up.
    dec.add_decode(301, HOST, peer.port, 40)
    transfer_room(peer, dec, 302, 4)  # the registration of 301 reached the prefill by now
    peer.request(dec, op="abort", room=301, message="prefill request cancelled")
    ev = drive_until(dec, lambda e: e.get("room") == 301, 5)
    assert ev["event"] == "failed" and "prefill request cancelled" in ev["message"]
    assert drive_until(dec, lambda e: e.get("room") == 301, 5) == {"event": "released", "room": 301}
    # The prefill gives up first; the decode registers afterwards.
    peer.request(dec, op="add_prefill", room=303, tokens=40, first_token=1)
    peer.request(dec, op="abort", room=303, message="prefill failed")
    assert peer.wait(lambda e: e.get("room") == 303, 5, dec)["event"] == "failed"
    dec.add_decode(303, HOST, peer.port, 40)
    ev = drive_until(dec, lambda e: e.get("room") == 303, 5)
    assert ev["event"] == "failed" and "prefill failed" in ev["message"]
    assert drive_until(dec, lambda e: e.get("room") == 303, 5)["event"] == "released"
    assert_no_pages_held(peer, dec)


def test_idle_transports_do_not_burn_cpu(prefill_peer, decode_side):
    peer, dec = prefill_peer, decode_side
    assert_no_pages_held(peer, dec)
    peer_cpu, own_cpu, start = peer.cpu_seconds(), time.process_time(), time.monotonic()
    while time.monotonic() - start < 1.0:
        dec.poll(0.5)
    own, remote = time.process_time() - own_cpu, peer.cpu_seconds() - peer_cpu
    assert own < 0.2, f"idle decode transport used {own:.3f} s CPU in 1 s"
    assert remote < 0.2, f"idle prefill peer used {remote:.3f} s CPU in 1 s"


def test_killed_prefill_fails_decode_room_within_transfer_timeout():
    peer = Peer("prefill")
    dec = Harness("decode", bootstrap_timeout=5.0, transfer_timeout=4.0)
    try:
        transfer_room(peer, dec, 401, 8)
        dec.add_decode(402, HOST, peer.port, 40)
        dec.poll(0.05)
        os.killpg(peer.proc.pid, signal.SIGKILL)
        start = time.monotonic()
        ev = drive_until(dec, lambda e: e.get("room") == 402, 6)
        # The side channel's TCP connection drops with the process: no need to wait the timeout.
        assert ev["event"] == "failed" and "lost the connection" in ev["message"], ev
        assert time.monotonic() - start < 4.0
        assert drive_until(dec, lambda e: e.get("room") == 402, 6)["event"] == "released"
        assert dec.pool.pages_in_use == 0 and not dec.transport.busy
    finally:
        dec.close()
        peer.stop()
