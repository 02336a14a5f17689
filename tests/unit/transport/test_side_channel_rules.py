"""The prefill's side-channel rules (peers.py, prefill_side.py) with fake NIXL and sockets:
who may register and abort which room, and what a dropped connection leaves behind."""

from __future__ import annotations

from components.engine.disagg.transport import prefill_side
from components.engine.disagg.transport.events import TransferFailed
from protocol.kv_side_channel import Abort, AbortAck, Hello, Refused, Register, Welcome
from tests.support.transport_fakes import BASE, PEER_RUNS, RUNS, SIZE, make_prefill


def hello(side, identity: bytes, name: str, metadata: bytes) -> None:
    side.on_message(identity, Hello(agent_name=name, agent_metadata=metadata, pool_base=BASE,
                                    pool_bytes=SIZE))


def test_a_bound_decode_stops_a_room_nobody_registered():
    side, nixl, server, events = make_prefill()
    side.add_prefill(7, RUNS, 1, "r")  # e.g. the decode rejected the request before registering
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message="too long"))
    assert events == [TransferFailed(7, "aborted by decode: too long")]
    assert server.sent == [(b"id-d", AbortAck(room=7, agent_name="fake-agent"))]


def test_only_the_registering_connection_may_abort_or_reregister_a_room():
    side, nixl, server, events = make_prefill()
    hello(side, b"id-x", "other", b"md-x")
    assert server.sent[-1] == (b"id-x", Welcome(agent_name="fake-agent"))
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.on_message(b"id-x", Abort(room=7, agent_name="other", message="hijack"))
    side.on_message(b"id-x", Register(room=7, agent_name="other", runs=PEER_RUNS))
    assert isinstance(server.sent[-1][1], Abort) and "another decode" in server.sent[-1][1].message
    side.add_prefill(7, RUNS, 1, "r")
    assert nixl.writes[0][0] == "dec" and events == []


def test_a_connection_speaks_for_one_agent_only():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="someone", runs=PEER_RUNS))
    assert "speaks for agent 'dec'" in server.sent[-1][1].message
    hello(side, b"id-d", "second-name", b"md-2")
    assert isinstance(server.sent[-1][1], Refused)


def test_registrations_of_a_dropped_connection_are_never_written():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.on_disconnect(b"id-d")
    side.add_prefill(7, RUNS, 1, "r")
    assert not nixl.writes and len(events) == 1 and "dropped" in events[0].message
    hello(side, b"id-d2", "dec", b"md")  # the same agent, reconnected: welcome again
    assert server.sent[-1] == (b"id-d2", Welcome(agent_name="fake-agent"))


def test_a_flooding_peer_cannot_lock_out_another(monkeypatch):
    monkeypatch.setattr(prefill_side, "MAX_PENDING", 4)
    side, nixl, server, events = make_prefill()
    hello(side, b"id-x", "flood", b"md-x")
    for room in range(100, 110):
        side.on_message(b"id-x", Register(room=room, agent_name="flood", runs=PEER_RUNS))
    assert side.counters["registrations"] == 4
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    assert side.counters["registrations"] == 4  # the flooder's oldest made room
    side.add_prefill(7, RUNS, 1, "r")
    assert nixl.writes and nixl.writes[0][0] == "dec"
    evicted = [m for who, m in server.sent if who == b"id-x" and isinstance(m, Abort)
               and "evicted" in m.message]
    assert [m.room for m in evicted] == [100]
