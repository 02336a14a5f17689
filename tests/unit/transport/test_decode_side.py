"""Unit tests of the KV transport's decode side, with fake NIXL and fake sockets: when a
room's pages may be freed."""

from __future__ import annotations

import time

import pytest

from components.engine.disagg.transport.events import (
    FailureKind,
    KVArrived,
    RoomReleased,
    TransferFailed,
)
from protocol.kv_side_channel import (
    Abort,
    AbortAck,
    KVNotif,
    Register,
    encode,
)
from tests.support.transport_fakes import (
    RUNS,
    make_decode,
    welcome,
)


def test_decode_registers_and_reports_arrival():
    side, nixl, client, events = make_decode()
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    assert client.sent == [(("127.0.0.1", 5000), Register(7, "fake-agent", RUNS))]
    welcome(side)
    nixl.inbox = [("pre", b"garbage"), ("pre", encode(KVNotif(room=99, first_token=1))),
                  ("pre", encode(KVNotif(room=7, first_token=3)))]
    side.progress(time.monotonic())
    assert events == [KVArrived(7, 3)] and not side.busy


def test_the_prefills_cache_hit_travels_with_the_kv():
    """What the prefill served from its prefix cache reaches the decode (its usage reports it,
    as SGLang's decode does); a notification without it is the bytes of one from before."""
    side, nixl, _, events = make_decode()
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    welcome(side)
    nixl.inbox = [("pre", encode(KVNotif(room=7, first_token=3, cached_tokens=480)))]
    side.progress(time.monotonic())
    assert events == [KVArrived(7, 3, None, 480)]
    assert b"cached_tokens" not in encode(KVNotif(room=7, first_token=3))


def test_decode_abort_keeps_pages_until_prefill_acks():
    side, nixl, client, events = make_decode()
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.abort(7, "client gone")
    assert client.sent[-1][1] == Abort(room=7, agent_name="fake-agent", message="client gone")
    side.progress(time.monotonic())
    assert events == [] and side.busy
    side.on_message(("127.0.0.1", 5000), AbortAck(room=7, agent_name="p"))
    assert events == [RoomReleased(7)] and not side.busy


def test_decode_abort_releases_at_once_if_prefill_never_connected():
    side, _, client, events = make_decode(connected=False)
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.abort(7, "gone")
    # The queued Register is dropped with the socket, so nothing can write into the pages.
    assert client.forgotten == [("127.0.0.1", 5000)]
    assert events == [RoomReleased(7)]


def test_decode_abort_before_connect_waits_when_another_room_shares_the_socket():
    side, _, client, events = make_decode(connected=False, transfer_timeout=0.5)
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.add_decode(8, "127.0.0.1", 5000, RUNS, "r")
    side.abort(7, "gone")
    assert client.forgotten == [] and isinstance(client.sent[-1][1], Abort)
    assert events == []  # the Register may still be delivered: keep the pages
    side.on_message(("127.0.0.1", 5000), AbortAck(room=7, agent_name="p"))
    assert events == [RoomReleased(7)]


def test_decode_timeout_fails_then_releases_after_ack_or_grace():
    side, _, client, events = make_decode(transfer_timeout=0.5)
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.add_decode(8, "127.0.0.1", 5000, RUNS, "r")
    side.progress(time.monotonic() + 0.6)
    assert [type(e) for e in events] == [TransferFailed, TransferFailed]
    assert "timed out waiting for KV of room 7" in events[0].message
    assert isinstance(client.sent[-1][1], Abort)
    side.on_message(("127.0.0.1", 5000), AbortAck(room=7, agent_name="p"))
    assert events[-1] == RoomReleased(7)
    side.progress(time.monotonic() + 1.5)  # no ack for room 8: released after the grace
    assert events[-1] == RoomReleased(8) and not side.busy


def test_decode_prefill_abort_and_disconnect_fail_and_release_at_once():
    side, _, _, events = make_decode()
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.add_decode(8, "127.0.0.1", 5001, RUNS, "r")
    side.on_message(("127.0.0.1", 5000), Abort(room=7, agent_name="p", message="oom"))
    assert events == [TransferFailed(7, "prefill aborted the KV transfer: oom"), RoomReleased(7)]
    side.on_disconnect(("127.0.0.1", 5001))
    assert isinstance(events[2], TransferFailed) and "lost the connection" in events[2].message
    assert events[3] == RoomReleased(8) and not side.busy


def test_decode_ends_a_room_the_prefill_refused_as_refused_with_its_message():
    side, _, _, events = make_decode()
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.on_message(("127.0.0.1", 5000),
                    Abort(room=7, agent_name="p", message="needs KV space", invalid=True))
    assert events == [TransferFailed(7, "needs KV space", FailureKind.INVALID), RoomReleased(7)]


def test_decode_rejects_bad_input():
    side, _, _, _ = make_decode()
    with pytest.raises(ValueError, match="invalid bootstrap address"):
        side.add_decode(7, "", 5000, RUNS, "r")
    with pytest.raises(ValueError, match="outside the registered KV pool"):
        side.add_decode(7, "127.0.0.1", 5000, [(1, 1)], "r")
