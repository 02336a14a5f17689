"""Finding 6 of issue 9: a WRITE that NIXL will not release keeps its pages held on both sides
until NIXL lets go (or a long backstop passes, with an ERROR). Fake NIXL and sockets."""

from __future__ import annotations

import logging
import time

from components.engine.disagg.transport.events import (
    HOLD_BACKSTOP_FACTOR,
    RoomReleased,
    TransferFailed,
)
from protocol.kv_side_channel import Abort, AbortAck, Holding, Register
from tests.support.transport_fakes import PEER_RUNS, RUNS, make_decode, make_prefill

T = 1.0  # transfer_timeout of both sides
EP = ("127.0.0.1", 5000)


def stuck_write(nixl):
    """NIXL refuses to release (cancel) the handle until ``nixl.stuck`` is cleared."""
    nixl.stuck = True
    real = type(nixl).release

    def release(handle):
        real(nixl, handle)
        return not nixl.stuck

    nixl.release = release


def test_prefill_keeps_a_timed_out_write_until_nixl_releases_it():
    side, nixl, server, events = make_prefill(transfer_timeout=T)
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 1, "r")
    stuck_write(nixl)
    now = time.monotonic()
    side.progress(now + T + 0.1)
    # Neither the source pages (TransferFailed) nor the decode's (Abort) may be freed yet.
    assert events == [] and side.busy
    assert server.sent == [(b"id-d", Holding(room=7, agent_name="fake-agent"))]
    side.progress(now + 3 * T)
    assert events == [] and len(server.sent) == 1
    nixl.stuck = False
    side.progress(now + 4 * T)
    assert len(events) == 1 and "timed out writing KV" in events[0].message
    assert isinstance(server.sent[-1][1], Abort) and not side.busy


def test_prefill_frees_a_stuck_write_after_the_backstop_with_an_error(caplog):
    side, nixl, server, events = make_prefill(transfer_timeout=T)
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 1, "r")
    stuck_write(nixl)
    now = time.monotonic()
    side.progress(now + T + 0.1)
    assert events == []
    with caplog.at_level(logging.ERROR):
        side.progress(now + T + 0.2 + HOLD_BACKSTOP_FACTOR * T)
    assert [type(e) for e in events] == [TransferFailed]
    assert any(r.levelno == logging.ERROR and "room 7" in r.getMessage() for r in caplog.records)


def test_decode_abort_during_a_stuck_write_is_acked_only_once_nixl_lets_go():
    side, nixl, server, events = make_prefill(transfer_timeout=T)
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 1, "r")
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message="client gone"))
    stuck_write(nixl)
    now = time.monotonic()
    side.progress(now + T + 0.1)
    assert events == [] and not [m for _, m in server.sent if isinstance(m, AbortAck)]
    nixl.stuck = False
    side.progress(now + 2 * T)
    assert server.sent[-1] == (b"id-d", AbortAck(room=7, agent_name="fake-agent"))
    assert [type(e) for e in events] == [TransferFailed]


def test_decode_keeps_pages_the_prefill_holds_past_its_grace():
    side, _, client, events = make_decode(transfer_timeout=T)
    side.add_decode(7, *EP, RUNS, "r")
    side.on_message(EP, Holding(room=7, agent_name="pre"))
    now = time.monotonic()
    side.progress(now + T + 0.1)  # decode gives up: fails the request, asks the prefill to stop
    assert [type(e) for e in events] == [TransferFailed]
    assert isinstance(client.sent[-1][1], Abort)
    side.progress(now + 3 * T)  # past the usual grace: a WRITE may still land
    assert events[1:] == [] and side.busy
    side.on_message(EP, AbortAck(room=7, agent_name="pre"))
    assert events[1:] == [RoomReleased(7)] and not side.busy


def test_decode_holding_after_its_abort_extends_the_grace_to_the_backstop():
    side, _, _, events = make_decode(transfer_timeout=T)
    side.add_decode(7, *EP, RUNS, "r")
    side.abort(7, "client gone")
    side.on_message(EP, Holding(room=7, agent_name="pre"))
    now = time.monotonic()
    side.progress(now + 2 * T)
    assert events == [] and side.busy
    side.progress(now + (HOLD_BACKSTOP_FACTOR + 1) * T)  # the backstop: released, with an ERROR
    assert events == [RoomReleased(7)]
