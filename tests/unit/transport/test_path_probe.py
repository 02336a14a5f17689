"""The KV path probe (components/engine/disagg/transport/path_probe.py and probe_writes.py), with
fake NIXL and fake sockets. A decode's first rooms for a prefill wait until one small transfer
has proved the path (the pattern in the slot, the notification from the Welcome's agent); a
path that fails fails them at once with a 503 naming the prefill, what did not arrive and the
UCX settings, and every new room for it until the retry time. The prefill WRITEs the pattern
into the slot the decode named and answers ``Probed``."""

from __future__ import annotations

import time

import torch

from components.engine.disagg.failures import FAILURE_STATUS_BY_KIND
from components.engine.disagg.transport import path_probe
from components.engine.disagg.transport.events import FailureKind, RoomReleased, TransferFailed
from components.engine.disagg.transport.nixl_endpoint import probe_pattern
from components.engine.disagg.transport.path_probe import PROBE_TIMEOUT_S
from components.engine.disagg.transport.prefill_side import PrefillSide
from protocol.kv_side_channel import (
    PROBE_BYTES, Abort, Hello, KVNotif, Probe, Probed, Register, encode, notif_decoder,
)
from tests.support.transport_fakes import (
    BASE, PROBE_BASE, RUNS, SIZE, FakeNixl, FakeServer, make_decode, welcome,
)

ENDPOINT = ("127.0.0.1", 5000)


def sent(client, kind) -> list:
    return [msg for _, msg in client.sent if isinstance(msg, kind)]


def land(nixl, probe: Probe, agent: str = "pre", data: bool = True) -> None:
    """What the prefill's probe WRITE does: the pattern into the slot, then the notification."""
    if data:
        pattern = torch.frombuffer(bytearray(probe_pattern()), dtype=torch.uint8)
        nixl.probe[probe.slot * PROBE_BYTES:(probe.slot + 1) * PROBE_BYTES] = pattern
    nixl.inbox.append((agent, encode(KVNotif(room=probe.nonce, first_token=0))))


def test_rooms_wait_for_the_probe_then_register_and_later_rooms_go_at_once():
    side, nixl, client, events = make_decode(probe=True)
    side.add_decode(7, *ENDPOINT, RUNS, "r")
    side.add_decode(8, *ENDPOINT, RUNS, "r")
    [probe] = sent(client, Probe)
    assert sent(client, Register) == [] and side.busy
    land(nixl, probe)  # before the Welcome: kept until the Welcome names the agent
    side.progress(time.monotonic())
    assert sent(client, Register) == []
    welcome(side)
    side.progress(time.monotonic())
    assert [r.room for r in sent(client, Register)] == [7, 8] and events == []
    side.add_decode(9, *ENDPOINT, RUNS, "r")
    assert [r.room for r in sent(client, Register)] == [7, 8, 9]
    assert len(sent(client, Probe)) == 1


def broken(monkeypatch, land_it=None, probed: str | None = None):
    """A decode whose probe of ENDPOINT failed after the Welcome; its events so far."""
    side, nixl, client, events = make_decode(probe=True)
    side.add_decode(7, *ENDPOINT, RUNS, "r")
    [probe] = sent(client, Probe)
    welcome(side)
    if land_it:
        land_it(nixl, probe)
    if probed is not None:
        side.on_message(ENDPOINT, Probed(probe.nonce, "pre", probed))
    side.progress(time.monotonic())
    if probed:  # the prefill said its WRITE failed: decided at once
        return side, client, events
    assert events == []
    side.progress(time.monotonic() + PROBE_TIMEOUT_S + 0.1)
    return side, client, events


def test_a_lost_probe_notification_fails_the_rooms_at_once_with_a_503(monkeypatch):
    side, client, events = broken(monkeypatch, probed="")  # WRITE DONE, no notification
    failed, released = events
    assert failed.kind is FailureKind.PATH_BROKEN and FAILURE_STATUS_BY_KIND[failed.kind] == 503
    for part in ("prefill 127.0.0.1:5000", "'pre'", "notification", "never arrived", "UCX_TLS",
                 "UCX_PROTO_INFO=y"):
        assert part in failed.message, failed.message
    assert released == RoomReleased(7)  # never registered: nothing can write into its pages
    assert sent(client, Register) == [] and sent(client, Abort)[-1].room == 7
    events.clear()
    side.add_decode(8, *ENDPOINT, RUNS, "r")  # the verdict holds: no wait, no second probe
    assert [type(e) for e in events] == [TransferFailed, RoomReleased]
    assert events[0].kind is FailureKind.PATH_BROKEN and len(sent(client, Probe)) == 1


def test_after_the_retry_time_the_prefill_is_probed_again(monkeypatch):
    # The verdict is reached at a time past now (the test's clock); a retry time below zero
    # puts the retry before the next room.
    monkeypatch.setattr(path_probe, "PROBE_RETRY_S", -PROBE_TIMEOUT_S - 1)
    side, client, events = broken(monkeypatch)
    assert "neither the probe's data nor its notification arrived" in events[0].message
    side.add_decode(8, *ENDPOINT, RUNS, "r")
    assert len(sent(client, Probe)) == 2 and len(events) == 2  # room 8 waits for the new one


def test_a_notification_without_the_data_or_from_another_agent_breaks_the_path(monkeypatch):
    _, _, events = broken(monkeypatch, lambda nixl, p: land(nixl, p, data=False))
    assert "the probe's notification arrived but its data did not" in events[0].message
    _, _, events = broken(monkeypatch, lambda nixl, p: land(nixl, p, agent="stranger"))
    assert "came from agent 'stranger', not 'pre'" in events[0].message


def test_a_failed_probe_write_breaks_the_path_at_once(monkeypatch):
    _, _, events = broken(monkeypatch, probed="the WRITE failed (NIXL state ERR)")
    assert events[0].kind is FailureKind.PATH_BROKEN
    assert "the prefill's probe WRITE failed: the WRITE failed (NIXL state ERR)" in events[0].message


def test_without_a_welcome_the_rooms_keep_their_own_timeout_and_a_new_connection_probes_anew():
    side, nixl, client, events = make_decode(probe=True, transfer_timeout=8.0)
    side.add_decode(7, *ENDPOINT, RUNS, "r")
    side.progress(time.monotonic() + PROBE_TIMEOUT_S + 1)
    assert events == []  # a prefill that never answers is not a broken KV path
    side.progress(time.monotonic() + 8.1)
    assert "timed out waiting for KV of room 7" in events[0].message
    side.on_disconnect(ENDPOINT)
    side.add_decode(8, *ENDPOINT, RUNS, "r")
    assert len(sent(client, Probe)) == 2


def prefill(write_state: str, probe_base: int = PROBE_BASE):
    nixl, server = FakeNixl(write_state), FakeServer()
    side = PrefillSide(nixl, server, 5.0, 5.0, [].append)
    side.on_message(b"id-d", Hello(agent_name="dec", agent_metadata=b"md", pool_base=BASE,
                                   pool_bytes=SIZE, probe_base=probe_base))
    server.sent.clear()
    return side, nixl, server


def test_the_prefill_writes_the_pattern_into_the_named_slot_and_answers():
    side, nixl, server = prefill("DONE")
    side.on_message(b"id-d", Probe(nonce=99, agent_name="dec", slot=3))
    [(peer, src, dst, notif)] = nixl.writes
    assert peer == "dec" and src == [(nixl.probe_base, PROBE_BYTES)]
    assert dst == [(PROBE_BASE + 3 * PROBE_BYTES, PROBE_BYTES)]
    assert notif_decoder.decode(notif) == KVNotif(room=99, first_token=0)
    assert server.sent == [(b"id-d", Probed(99, "fake-agent"))] and not side.busy


def test_the_prefill_reports_a_failed_or_impossible_probe():
    side, nixl, server = prefill("PROC")
    side.on_message(b"id-d", Probe(nonce=99, agent_name="dec", slot=0))
    assert side.busy and server.sent == []
    nixl.states[0] = "ERR"
    side.progress(time.monotonic())
    assert server.sent == [(b"id-d", Probed(99, "fake-agent",
                                            "the WRITE failed (NIXL state ERR)"))]
    assert nixl.released == [0] and not side.busy
    side, nixl, server = prefill("DONE", probe_base=0)
    side.on_message(b"id-d", Probe(nonce=5, agent_name="dec", slot=0))
    assert nixl.writes == []
    assert server.sent[0][1].reason == "the decode's Hello declared no probe buffer"
    side.on_message(b"id-x", Probe(nonce=6, agent_name="dec", slot=0))  # not its connection
    assert nixl.writes == [] and len(server.sent) == 1
