"""Finding 5 of issue 9: the KV side channel trusts only who introduced itself, over real ZMQ
and NIXL in one process (a prefill and a decode transport, plus a hostile raw peer)."""

from __future__ import annotations

import time

import pytest

from harness.transport_side import TransportSide, poll_until
from protocol.kv_side_channel import Abort, Hello, KVNotif, Register, encode
from tests.support.kv_rogue import HOST, Rogue, RogueAgent


def run_room(pre, dec, room, tokens=24):
    dec.add_decode(room, HOST, pre.transport.bootstrap_port, tokens)
    pre.add_prefill(room, tokens, first_token=room % 1000)
    ev = poll_until([pre, dec], lambda e: e.get("room") == room and e["event"] != "done", 10)
    assert ev == {"event": "arrived", "room": room, "first_token": room % 1000}, ev
    assert dec.check(room), f"room {room}: KV differs from what prefill held"
    dec.free(room)
    assert poll_until([pre, dec], lambda e: e == {"event": "done", "room": room}, 10)


@pytest.fixture
def pair():
    pre = TransportSide("prefill", bootstrap_timeout=5.0, transfer_timeout=5.0)
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=5.0)
    rogue = Rogue(pre.transport.bootstrap_port)
    yield pre, dec, rogue
    rogue.close()
    pre.close()
    dec.close()


def test_replayed_metadata_under_another_name_does_not_unload_the_decode(pair):
    pre, dec, rogue = pair
    run_room(pre, dec, 21)  # the prefill knows the decode agent now
    rogue.send(Hello(agent_name="impostor", agent_metadata=dec.transport.agent_metadata,
                     ucx_error_handling="none"))
    rogue.send(Register(room=22, agent_name="impostor", runs=[(dec.pool.data_ptr, 64)]))
    abort = rogue.wait_reply(lambda: pre.poll(0.005), lambda m: isinstance(m, Abort))
    assert abort.room == 22
    run_room(pre, dec, 23)


def test_name_of_a_connected_decode_cannot_be_taken_over(pair):
    pre, dec, rogue = pair
    run_room(pre, dec, 31)
    twin = RogueAgent(dec.transport.agent_name)  # same name, its own memory and address
    try:
        rogue.send(twin.hello())
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pre.poll(0.005)
            twin.pump()
        run_room(pre, dec, 32)  # KV still goes to the real decode
    finally:
        twin.close()


def test_abort_of_a_room_from_another_connection_is_ignored(pair):
    pre, dec, rogue = pair
    run_room(pre, dec, 41)
    dec.add_decode(42, HOST, pre.transport.bootstrap_port, 24)
    run_room(pre, dec, 43)  # same connection, in order: the prefill has room 42's Register
    rogue.send(Abort(room=42, agent_name=dec.transport.agent_name, message="hijack"))
    for _ in range(20):
        pre.poll(0.005)
    pre.add_prefill(42, 24, first_token=42)
    ev = poll_until([pre, dec], lambda e: e.get("room") == 42 and e["event"] != "done", 10)
    assert ev["event"] == "arrived", ev
    assert dec.check(42)
    dec.free(42)


def test_register_outside_the_peer_pool_is_refused(pair):
    pre, dec, rogue = pair
    agent = RogueAgent("rogue-decode")
    try:
        rogue.send(agent.hello())
        # Inside the real decode's pool, outside the rogue's own: a write-anywhere primitive.
        rogue.send(Register(room=51, agent_name=agent.name, runs=[(dec.pool.data_ptr, 4096)]))
        abort = rogue.wait_reply(lambda: pre.poll(0.005), lambda m: isinstance(m, Abort))
        assert abort.room == 51 and "outside" in abort.message
    finally:
        agent.close()


def test_kv_notification_from_a_stranger_agent_is_ignored(pair):
    pre, dec, rogue = pair
    run_room(pre, dec, 61)
    stranger = RogueAgent("stranger")
    try:
        stranger.agent.add_remote_agent(dec.transport.agent_metadata)
        dec.add_decode(62, HOST, pre.transport.bootstrap_port, 24)
        stranger.agent.send_notif(dec.transport.agent_name, encode(KVNotif(room=62, first_token=9)))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            dec.poll(0.01)
            pre.poll(0.001)
            stranger.pump()
        assert not [e for e in dec.events if e.get("room") == 62], dec.events
        pre.add_prefill(62, 24, first_token=62)
        ev = poll_until([pre, dec], lambda e: e.get("room") == 62 and e["event"] != "done", 10)
        assert ev == {"event": "arrived", "room": 62, "first_token": 62}
        assert dec.check(62)
        dec.free(62)
    finally:
        stranger.close()


def test_a_decode_that_reconnects_keeps_its_name(pair):
    pre, dec, rogue = pair
    rogue.close()  # only the decode's connections count below
    run_room(pre, dec, 71)
    # Reached privately: the transport has (and needs) no public way to drop one link.
    dec.transport._client.forget((HOST, pre.transport.bootstrap_port))  # as after a lost link
    deadline = time.monotonic() + 5
    # The prefill sees the old connection (and the rogue's) go before the decode dials again;
    # a decode whose old link the prefill still holds open is refused, by design (a name in use
    # is never taken over).
    while pre.transport.bootstrap_connections > 0 and time.monotonic() < deadline:
        pre.poll(0.01)
    assert pre.transport.bootstrap_connections == 0
    run_room(pre, dec, 72)
    assert pre.transport.counters["peers"] == 1
