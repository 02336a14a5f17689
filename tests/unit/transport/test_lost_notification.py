"""A WRITE the prefill saw DONE whose NIXL notification never reaches the decode (seen across
network namespaces under UCX's default adaptive progress): the decode fails the room after the
grace that follows the prefill's ``Written``, naming the prefill and the transport, and the
prefill, told so, stops counting the WRITE as done. Fake NIXL and sockets."""

from __future__ import annotations

import time

from components.engine.disagg.transport.events import (
    NOTIF_LOST, FailureKind, TransferDone, TransferFailed, notif_grace,
)
from protocol.kv_side_channel import Abort, Register, Written
from tests.support.transport_fakes import PEER_RUNS, RUNS, make_decode, make_prefill, welcome

EP = ("127.0.0.1", 5000)


def test_written_without_notification_fails_after_the_grace_not_the_transfer_timeout():
    side, _, client, events = make_decode(transfer_timeout=30.0)
    side.add_decode(7, *EP, PEER_RUNS, "r")
    welcome(side)
    side.on_message(EP, Written(room=7, agent_name="pre"))
    now = time.monotonic()
    side.progress(now + notif_grace(30.0) - 0.5)
    assert events == []  # within the grace: the notification may still come
    side.progress(now + notif_grace(30.0) + 0.1)
    (failed,) = events
    assert isinstance(failed, TransferFailed) and failed.kind is FailureKind.TIMED_OUT
    assert failed.message.startswith(NOTIF_LOST)
    assert "127.0.0.1:5000" in failed.message and "'pre'" in failed.message
    assert "UCX" in failed.message
    abort = client.sent[-1][1]
    assert isinstance(abort, Abort) and abort.message.startswith(NOTIF_LOST)


def test_without_written_the_bound_is_the_transfer_timeout():
    side, _, _, events = make_decode(transfer_timeout=30.0)
    side.add_decode(7, *EP, PEER_RUNS, "r")
    welcome(side)
    side.progress(time.monotonic() + notif_grace(30.0) + 1)
    assert events == []


def test_the_grace_never_exceeds_a_short_transfer_timeout():
    assert notif_grace(2.0) == 2.0 and notif_grace(30.0) == 5.0


def test_prefill_stops_counting_a_write_whose_notification_was_lost():
    side, nixl, server, events = make_prefill()
    side.on_message(b"id-d", Register(room=7, agent_name="dec", runs=PEER_RUNS))
    side.add_prefill(7, RUNS, 42, "r")
    nixl.states[0] = "DONE"
    side.progress(time.monotonic())
    assert events == [TransferDone(7)] and side.totals.writes == 1
    nbytes = side.totals.nbytes
    assert nbytes > 0
    # Another decode connection cannot un-count it; an ordinary late abort does not either.
    side.on_message(b"id-x", Abort(room=7, agent_name="x", message=f"{NOTIF_LOST}: forged"))
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message="client gone"))
    assert side.totals.writes == 1
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message=f"{NOTIF_LOST}: never came"))
    assert side.totals.writes == 0 and side.totals.nbytes == 0
    side.on_message(b"id-d", Abort(room=7, agent_name="dec", message=f"{NOTIF_LOST}: again"))
    assert side.totals.writes == 0  # once only


def test_ucx_context_polls_every_interface_unless_told_otherwise(monkeypatch):
    """ADAPTIVE_PROGRESS=n is the fix (docs/multi-host.md); NIXL splits engine_config on commas
    (a ';'-joined string was silently ignored, measured)."""
    from components.engine.disagg.transport.nixl_endpoint import ADAPTIVE_PROGRESS_ENV, engine_config

    monkeypatch.delenv(ADAPTIVE_PROGRESS_ENV, raising=False)
    assert engine_config("1g") == "ADAPTIVE_PROGRESS=n,CMA_SEG_SIZE=1g"
    assert engine_config(None) == "ADAPTIVE_PROGRESS=n"
    monkeypatch.setenv(ADAPTIVE_PROGRESS_ENV, "y")
    assert engine_config("1g") == "ADAPTIVE_PROGRESS=y,CMA_SEG_SIZE=1g"
