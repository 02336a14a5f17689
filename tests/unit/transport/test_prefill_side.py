"""Unit tests of the KV transport's run pairing, wire messages and prefill side, with fake
NIXL and fake sockets (no processes, no UCX)."""

from __future__ import annotations

import time

import msgspec
import pytest

from components.engine.disagg.transport.events import TransferDone, TransferFailed
from components.engine.disagg.transport.runs import check_within, coalesce, pair_runs
from protocol.kv_side_channel import (
    Abort,
    AbortAck,
    Hello,
    Holding,
    KVNotif,
    Refused,
    Register,
    Written,
    encode,
    notif_decoder,
    to_decode_decoder,
    to_prefill_decoder,
)
from tests.support.transport_fakes import (
    BASE,
    PEER_RUNS,
    RUNS,
    SIZE,
    make_decode,
    make_prefill,
)


def test_pair_runs_identity_and_refinement():
    assert pair_runs(RUNS, [(1, 256), (2, 256)]) == (RUNS, [(1, 256), (2, 256)])
    src, dst = pair_runs([(100, 10), (200, 30)], [(0, 25), (50, 15)])
    assert src == [(100, 10), (200, 15), (215, 15)]
    assert dst == [(0, 10), (10, 15), (50, 15)]


def test_coalesce_joins_only_runs_adjacent_on_both_sides():
    # 0-10 + 10-20 continue each other on both sides: one run; the third starts a gap on dst.
    src, dst = coalesce([(0, 10), (10, 10), (20, 5)], [(100, 10), (110, 10), (200, 5)])
    assert (src, dst) == ([(0, 20), (20, 5)], [(100, 20), (200, 5)])
    # Adjacent on one side only: kept apart (the bytes would land in the wrong place).
    assert coalesce([(0, 10), (10, 10)], [(100, 10), (300, 10)]) == (
        [(0, 10), (10, 10)], [(100, 10), (300, 10)])
    assert coalesce([], []) == ([], [])


def test_pair_runs_size_mismatch_names_both_sides():
    match = "prefill has 2 runs / 512 bytes, decode registered 1 runs / 100"
    with pytest.raises(ValueError, match=match):
        pair_runs(RUNS, [(0, 100)])


def test_check_within_rejects_runs_outside_the_pool():
    with pytest.raises(ValueError, match="outside the registered KV pool"):
        check_within([(BASE + SIZE - 8, 16)], BASE, SIZE, "room 1")
    with pytest.raises(ValueError, match="no KV runs"):
        check_within([], BASE, SIZE, "room 1")


# --- protocol ---------------------------------------------------------------------------------
def test_messages_round_trip_and_reject_bad_shapes():
    reg = Register(room=5, agent_name="d", runs=[(1, 2)])
    assert to_prefill_decoder.decode(encode(reg)) == reg
    assert to_decode_decoder.decode(encode(AbortAck(room=5, agent_name="p"))) == AbortAck(5, "p")
    assert notif_decoder.decode(encode(KVNotif(room=5, first_token=9))).first_token == 9
    bad = [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode({"type": "nope", "room": 1}),  # unknown tag
        msgspec.msgpack.encode({"type": "register", "room": 0, "agent_name": "d",
                                "runs": [[1, 2]]}),  # room 0 is reserved
        msgspec.msgpack.encode({"type": "register", "room": 1, "agent_name": "d",
                                "runs": [[1, 0]]}),  # empty run
        msgspec.msgpack.encode({"type": "register", "room": 1, "agent_name": "d", "runs": []}),
        encode(AbortAck(room=5, agent_name="p")),  # valid, but not for the prefill
    ]
    for data in bad:
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            to_prefill_decoder.decode(data)


# --- prefill ----------------------------------------------------------------------------------
def test_the_write_notifies_the_prefills_cache_hit():
    side, nixl, _, _ = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 42, "r", cached_tokens=480)
    assert notif_decoder.decode(nixl.writes[0][3]) == KVNotif(room=7, first_token=42,
                                                              cached_tokens=480)


@pytest.mark.parametrize("prefill_first", [True, False])
def test_prefill_writes_when_both_sides_present(prefill_first):
    side, nixl, server, events = make_prefill()
    reg = Register(room=7, agent_name="dec", runs=PEER_RUNS)
    if prefill_first:
        side.add_prefill(7, RUNS, 42, "r")
        assert not nixl.writes
        side.on_message(b"id-d", reg)
    else:
        side.on_message(b"id-d", reg)
        assert not nixl.writes
        side.add_prefill(7, RUNS, 42, "r")
    peer, src, dst, notif = nixl.writes[0]
    assert peer == "dec" and src == RUNS and dst == [(BASE + 4096, 256), (BASE + 4352, 256)]
    assert notif_decoder.decode(notif) == KVNotif(room=7, first_token=42)
    side.progress(time.monotonic())
    assert events == [] and side.busy
    nixl.states[0] = "DONE"
    side.progress(time.monotonic())
    assert events == [TransferDone(7)] and not side.busy and nixl.released == [0]
    # ... and wakes the decode, whose notification is already on its way.
    assert server.sent[-1] == (b"id-d", Written(room=7, agent_name="fake-agent"))


def test_decode_takes_written_as_a_wake_up_only():
    side, nixl, client, events = make_decode()
    side.on_message(("127.0.0.1", 5000), Written(room=7, agent_name="pre"))  # no such room
    side.add_decode(7, "127.0.0.1", 5000, PEER_RUNS, "r")
    side.on_message(("127.0.0.1", 5000), Written(room=7, agent_name="pre"))
    assert events == [] and side.busy  # only the NIXL notification completes the room


def test_prefill_abort_during_write_waits_for_the_handle():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 1, "r")
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message="client gone"))
    side.progress(time.monotonic())
    # WRITE still in flight: nothing freed or acked; decode is told to keep its pages.
    assert events == [] and server.sent == [(b"id-d", Holding(room=7, agent_name="fake-agent"))]
    server.sent.clear()
    nixl.states[0] = "DONE"
    side.progress(time.monotonic())
    assert events == [TransferFailed(7, "aborted by decode: client gone")]
    assert server.sent == [(b"id-d", AbortAck(room=7, agent_name="fake-agent"))]


def test_local_abort_during_write_tells_decode_after_the_handle_settles():
    side, nixl, server, events = make_prefill()
    side.add_prefill(7, RUNS, 1, "r")
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.abort(7, "Aborted by client")
    side.progress(time.monotonic())
    assert events == []
    nixl.states[0] = "ERR"
    side.progress(time.monotonic())
    assert events == [TransferFailed(7, "Aborted by client")]
    assert server.sent == [(b"id-d", Abort(7, "fake-agent", "Aborted by client"))]


def test_decode_abort_before_prefill_makes_add_prefill_fail_fast():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message="gone"))
    assert server.sent == [(b"id-d", AbortAck(room=7, agent_name="fake-agent"))]
    side.add_prefill(7, RUNS, 1, "r")
    assert events == [TransferFailed(7, "aborted by decode: gone")] and not nixl.writes


def test_prefill_abort_before_kv_is_ready_fails_the_decode_registration():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.abort(7, "prefill request aborted")
    assert server.sent == [(b"id-d", Abort(7, "fake-agent", "prefill request aborted"))]
    side.on_message(b"id-d", Register(room=8, agent_name="dec", runs=PEER_RUNS))
    side.abort(9, "early")  # registration comes later: it is answered with an Abort
    side.on_message(b"id-d", Register(room=9, agent_name="dec", runs=PEER_RUNS))
    assert server.sent[-1][1] == Abort(room=9, agent_name="fake-agent", message="early")
    assert events == [] and not nixl.writes


def test_a_refused_request_reaches_decode_as_refused_before_and_after_it_registers():
    side, _, server, _ = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.abort(7, "needs KV space for 1500 tokens", invalid=True)
    side.abort(9, "needs KV space for 1500 tokens", invalid=True)
    side.on_message(b"id-d", Register(room=9, agent_name="dec", runs=PEER_RUNS))  # later
    assert [m for _, m in server.sent] == [
        Abort(7, "fake-agent", "needs KV space for 1500 tokens", invalid=True),
        Abort(9, "fake-agent", "needs KV space for 1500 tokens", invalid=True)]


def test_an_unregistered_room_given_up_by_one_peer_stays_open_to_the_decode_that_registers():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-x", Hello(agent_name="x", agent_metadata=b"mx", pool_base=BASE,
                                   pool_bytes=SIZE))
    server.sent.clear()
    side.on_message(b"id-x", Abort(room=7, agent_name="x", message="guessed"))
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    assert [m for _, m in server.sent] == [AbortAck(room=7, agent_name="fake-agent")]
    side.add_prefill(7, RUNS, 1, "r")
    assert nixl.writes and events == []  # the registered decode's room is written
    side.on_message(b"id-x", Abort(room=8, agent_name="x", message="gone"))
    side.on_message(b"id-x", Register(room=8, agent_name="x", runs=PEER_RUNS))
    assert server.sent[-1][1] == Abort(8, "fake-agent", "aborted by decode: gone")


def test_prefill_times_out_waiting_for_decode():
    side, nixl, server, events = make_prefill(bootstrap_timeout=0.5)
    side.add_prefill(7, RUNS, 1, "r")
    side.progress(time.monotonic() + 0.4)
    assert events == []
    side.progress(time.monotonic() + 0.6)
    assert len(events) == 1
    assert "timed out waiting for decode to register room 7" in events[0].message
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))  # too late
    assert isinstance(server.sent[-1][1], Abort) and not nixl.writes


def test_prefill_layout_mismatch_fails_both_sides_with_a_clear_message():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=[(BASE, 100)]))
    side.add_prefill(7, RUNS, 1, "r")
    assert len(events) == 1 and "KV layout mismatch" in events[0].message
    reply = server.sent[-1][1]
    assert isinstance(reply, Abort) and "KV layout mismatch" in reply.message


def test_prefill_rejects_unknown_agents_bad_hello_and_bad_local_input():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-x", Hello(agent_name="evil", agent_metadata=b"bad"))
    side.on_message(b"id-x", Register(room=3, agent_name="evil", runs=PEER_RUNS))
    (who, refused), (_, abort) = server.sent
    assert who == b"id-x" and isinstance(refused, Refused) and "NIXL_ERR_MISMATCH" in refused.reason
    assert abort.room == 3 and "prefill does not know this decode agent" in abort.message
    with pytest.raises(ValueError, match="outside the registered KV pool"):
        side.add_prefill(4, [(0, 16)], 1, "r")
    side.add_prefill(5, RUNS, 1, "r")
    with pytest.raises(ValueError, match="already"):
        side.add_prefill(5, RUNS, 1, "r")


# --- decode -----------------------------------------------------------------------------------


def test_a_decode_that_disconnects_is_unloaded_from_nixl_unless_a_write_to_it_is_in_flight():
    """A killed and restarted decode comes back as another agent: the old one must not stay
    loaded (stale NIXL state), except while a WRITE to it may still land."""
    side, nixl, _, _ = make_prefill()
    assert nixl.peers == {"dec"}
    side.add_prefill(7, RUNS, 42, "r")
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.on_disconnect(b"id-d")  # the WRITE is in flight (PROC)
    assert nixl.peers == {"dec"}
    side, nixl, _, _ = make_prefill()
    side.on_disconnect(b"id-d")
    assert nixl.peers == set() and side.counters["peers"] == 0
