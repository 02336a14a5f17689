"""KV transport across two processes: a prefill peer process and a decode side in the test process.

Real ZMQ side channel and real NIXL (UCX) WRITEs between separate processes; plain KV pools with
known data (no model).
"""

from __future__ import annotations

import time

import pytest

from harness.transport_peer import Peer
from harness.transport_side import TransportSide, poll_until

HOST = "127.0.0.1"


def transfer_room(peer: Peer, dec: TransportSide, room: int, tokens: int) -> None:
    dec.add_decode(room, HOST, peer.port, tokens)
    peer.request(dec, op="add_prefill", room=room, tokens=tokens, first_token=room % 1000)
    poll_until([dec], lambda e: e.get("room") == room and e["event"] == "arrived", 10)
    peer.wait(lambda e: e == {"event": "done", "room": room}, 10, dec)
    dec.free(room)


@pytest.fixture(scope="module")
def prefill_peer():
    peer = Peer("prefill", bootstrap_timeout=5.0, transfer_timeout=10.0)
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def decode_side(prefill_peer):
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=10.0)
    transfer_room(prefill_peer, dec, 1, 8)  # warm-up: connection, hello, UCX wire-up
    yield dec
    dec.close()


def assert_no_pages_held(peer: Peer, dec: TransportSide) -> None:
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
        ev = poll_until([dec], lambda e, r=room: e.get("room") == r and e["event"] != "released",
                        15)
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
    ev = poll_until([dec], lambda e: e.get("room") == 201, 5)
    assert ev == {"event": "released", "room": 201}
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
    ev = poll_until([dec], lambda e: e.get("room") == 301, 5)
    assert ev["event"] == "failed" and "prefill request cancelled" in ev["message"]
    ev = poll_until([dec], lambda e: e.get("room") == 301, 5)
    assert ev == {"event": "released", "room": 301}
    # The prefill gives up first; the decode registers afterwards.
    peer.request(dec, op="add_prefill", room=303, tokens=40, first_token=1)
    peer.request(dec, op="abort", room=303, message="prefill failed")
    assert peer.wait(lambda e: e.get("room") == 303, 5, dec)["event"] == "failed"
    dec.add_decode(303, HOST, peer.port, 40)
    ev = poll_until([dec], lambda e: e.get("room") == 303, 5)
    assert ev["event"] == "failed" and "prefill failed" in ev["message"]
    assert poll_until([dec], lambda e: e.get("room") == 303, 5)["event"] == "released"
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
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=4.0)
    try:
        transfer_room(peer, dec, 401, 8)
        dec.add_decode(402, HOST, peer.port, 40)
        dec.poll(0.05)
        peer.kill()
        start = time.monotonic()
        ev = poll_until([dec], lambda e: e.get("room") == 402, 6)
        # The side channel's TCP connection drops with the process: no need to wait the timeout.
        assert ev["event"] == "failed" and "lost the connection" in ev["message"], ev
        assert time.monotonic() - start < 4.0
        assert poll_until([dec], lambda e: e.get("room") == 402, 6)["event"] == "released"
        assert dec.pool.pages_in_use == 0 and not dec.transport.busy
    finally:
        dec.close()
        peer.stop()
