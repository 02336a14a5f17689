"""KV transport in one process: deadlines, hostile input, misuse, idle cost (real ZMQ and NIXL)."""

from __future__ import annotations

import socket
import time

import msgspec
import pytest
import torch
import zmq

from components.engine.disagg.transport import KVTransport
from harness.transport_side import TransportSide, expected_kv, poll_until
from protocol.kv_side_channel import (
    Abort,
    Hello,
    Refused,
    Register,
    encode,
    to_decode_decoder,
)

HOST = "127.0.0.1"


def run_room(pre, dec, room, tokens=24):
    dec.add_decode(room, HOST, pre.transport.bootstrap_port, tokens)
    pre.add_prefill(room, tokens, first_token=5)
    assert poll_until([pre, dec], lambda e: e.get("room") == room and e["event"] == "arrived", 10)
    assert dec.check(room)
    dec.free(room)
    assert poll_until([pre, dec], lambda e: e == {"event": "done", "room": room}, 10)


def test_prefill_room_fails_when_decode_never_registers():
    pre = TransportSide("prefill", bootstrap_timeout=1.0, transfer_timeout=5.0)
    try:
        start = time.monotonic()
        pre.add_prefill(11, 30, first_token=1)
        ev = poll_until([pre], lambda e: e.get("room") == 11, 4)
        waited = time.monotonic() - start
        assert ev["event"] == "failed"
        assert "timed out waiting for decode to register room 11" in ev["message"]
        assert 0.9 <= waited < 3.0
        assert pre.pool.pages_in_use == 0 and not pre.transport.busy
    finally:
        pre.close()


def test_decode_room_fails_when_no_prefill_listens():
    with socket.socket() as s:  # a port nobody listens on
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=1.0)
    try:
        start = time.monotonic()
        dec.add_decode(12, HOST, port, 30)
        ev = poll_until([dec], lambda e: e.get("room") == 12, 4)
        assert ev["event"] == "failed" and "timed out waiting for KV of room 12" in ev["message"]
        assert 0.9 <= time.monotonic() - start < 3.0
        # Never connected, so nothing can write into the pages: released at once.
        assert poll_until([dec], lambda e: e.get("room") == 12, 0.5)["event"] == "released"
        assert dec.pool.pages_in_use == 0 and not dec.transport.busy
    finally:
        dec.close()


def test_malformed_side_channel_messages_do_not_break_the_server(pair):
    pre, dec = pair
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"tcp://{HOST}:{pre.transport.bootstrap_port}")
    try:
        raw.send(b"\xc1 not msgpack")
        raw.send_multipart([b"two", b"frames"])
        raw.send(msgspec.msgpack.encode(
            {"type": "register", "room": -1, "agent_name": "x", "runs": []}))
        raw.send(encode(Hello(agent_name="evil", agent_metadata=b"not nixl metadata",
                              ucx_error_handling="none")))
        raw.send(encode(Register(room=13, agent_name="evil", runs=[(1, 64)])))
        replies = []
        deadline = time.monotonic() + 5
        while len(replies) < 2:
            pre.poll(0.01)
            if raw.poll(10):
                replies.append(to_decode_decoder.decode(raw.recv()))
            assert time.monotonic() < deadline, f"the server did not answer the agent: {replies}"
        refused, reply = replies
        assert isinstance(refused, Refused) and "unusable NIXL metadata" in refused.reason
        assert isinstance(reply, Abort) and reply.room == 13 and "does not know" in reply.message
        run_room(pre, dec, 14)  # the server still serves real peers
    finally:
        raw.close()


def test_malformed_nixl_notification_is_dropped(pair):
    pre, dec = pair
    run_room(pre, dec, 15)  # prefill now knows the decode agent
    # The prefill's own NIXL agent, reached privately: the garbage must come from a known peer,
    # and the transport has (and needs) no public way to send raw notifications.
    pre.transport._nixl._agent.send_notif(dec.transport.agent_name, b"\x00garbage")
    run_room(pre, dec, 16)
    assert dec.events == [] and pre.events == []


def test_layout_mismatch_fails_both_sides_over_real_transport(pair):
    pre, dec = pair
    dec.add_decode(17, HOST, pre.transport.bootstrap_port, 20)
    pre.add_prefill(17, 21, first_token=1)
    # The decode is polled too: its Register goes out once its KV path probe has passed.
    ev = poll_until([pre, dec], lambda e: e.get("room") == 17, 5)
    assert ev["event"] == "failed" and "KV layout mismatch" in ev["message"]
    ev = poll_until([dec], lambda e: e.get("room") == 17, 5)
    assert ev["event"] == "failed" and "KV layout mismatch" in ev["message"]
    assert poll_until([dec], lambda e: e.get("room") == 17, 5)["event"] == "released"
    assert pre.pool.pages_in_use == 0 and dec.pool.pages_in_use == 0


def test_misuse_raises_clear_errors(pair):
    pre, dec = pair
    runs = [(pre.pool.data_ptr, 64)]
    with pytest.raises(RuntimeError, match="needs a decode transport"):
        pre.transport.add_decode(1, HOST, 1, runs, "r")
    with pytest.raises(RuntimeError, match="needs a prefill transport"):
        dec.transport.add_prefill(1, runs, 1, "r")
    with pytest.raises(ValueError, match="outside the registered KV pool"):
        pre.transport.add_prefill(1, [(dec.pool.data_ptr, 64)], 1, "r")
    with pytest.raises(ValueError, match="role must be one of"):
        KVTransport(pre.pool.storage, "both", HOST, None, 1.0, 1.0)
    with pytest.raises(ValueError, match="transfer_timeout must be a positive"):
        KVTransport(pre.pool.storage, "decode", HOST, None, 1.0, 0)
    with pytest.raises(ValueError, match="contiguous"):
        KVTransport(torch.zeros(4, 4).t(), "decode", HOST, None, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="cannot bind"):
        KVTransport(dec.pool.storage, "prefill", HOST, pre.transport.bootstrap_port, 1.0, 1.0)
    pre.close()
    pre.close()  # idempotent
    assert pre.transport.poll(0.01) == []
    with pytest.raises(RuntimeError, match="closed"):
        pre.transport.add_prefill(1, runs, 1, "r")


def test_fresh_decode_transport_waits_without_spinning():
    dec = TransportSide("decode", bootstrap_timeout=1.0, transfer_timeout=1.0)
    try:
        cpu, start = time.process_time(), time.monotonic()
        assert dec.transport.poll(1.0) == []
        assert time.monotonic() - start >= 0.95
        assert time.process_time() - cpu < 0.2
    finally:
        dec.close()


def test_expected_kv_is_deterministic():
    assert torch.equal(expected_kv(3, 5), expected_kv(3, 5))
    assert not torch.equal(expected_kv(3, 5), expected_kv(4, 5))
