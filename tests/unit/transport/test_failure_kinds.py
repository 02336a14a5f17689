"""Transfer failures carry a kind, set where they are raised; the coordinator's one table maps
kinds to the status the client sees (fake NIXL and sockets)."""

from __future__ import annotations

import time

from components.engine.disagg.failures import FAILURE_STATUS_BY_KIND
from components.engine.disagg.transport.events import FailureKind, TransferFailed, abort_kind
from protocol.kv_side_channel import Abort, Register
from tests.support.transport_fakes import PEER_RUNS, RUNS, make_decode, make_prefill


def test_every_kind_has_a_status():
    assert set(FAILURE_STATUS_BY_KIND) == set(FailureKind)
    assert FAILURE_STATUS_BY_KIND[FailureKind.TIMED_OUT] == 504
    assert FAILURE_STATUS_BY_KIND[FailureKind.INVALID] == 400
    assert FAILURE_STATUS_BY_KIND[FailureKind.PEER_LOST] == 500


def test_an_abort_is_a_timeout_when_whoever_gave_up_says_it_timed_out():
    assert abort_kind("aborted by decode: timed out waiting for KV") is FailureKind.TIMED_OUT
    assert abort_kind("Aborted") is FailureKind.ABORTED
    assert TransferFailed(1, "x", FailureKind.INVALID).invalid
    assert not TransferFailed(1, "x").invalid


def test_prefill_timeouts_and_peer_aborts_carry_their_kind():
    side, _, _, events = make_prefill(bootstrap_timeout=0.5)
    side.add_prefill(7, RUNS, 1, "r")
    side.progress(time.monotonic() + 0.6)
    assert [e.kind for e in events] == [FailureKind.TIMED_OUT]
    side.on_message(b"id-d", Register(room=8, agent_name="dec", runs=PEER_RUNS))
    side.on_message(b"id-d", Abort(room=8, agent_name="dec", message="timed out waiting"))
    side.add_prefill(8, RUNS, 1, "r")  # fails fast, as the decode's abort said
    assert events[-1] == TransferFailed(8, "aborted by decode: timed out waiting",
                                        FailureKind.TIMED_OUT)


def test_decode_failures_carry_their_kind():
    side, _, _, events = make_decode(transfer_timeout=0.5)
    side.add_decode(7, "127.0.0.1", 5000, RUNS, "r")
    side.add_decode(8, "127.0.0.1", 5001, RUNS, "r")
    side.add_decode(9, "127.0.0.1", 5002, RUNS, "r")
    side.on_message(("127.0.0.1", 5000), Abort(room=7, agent_name="p", message="too big",
                                               invalid=True))
    side.on_disconnect(("127.0.0.1", 5001))
    side.progress(time.monotonic() + 0.6)
    kinds = {e.room: e.kind for e in events if isinstance(e, TransferFailed)}
    assert kinds == {7: FailureKind.INVALID, 8: FailureKind.PEER_LOST, 9: FailureKind.TIMED_OUT}
