"""Fake NIXL endpoint and fake side-channel sockets for the KV transport's unit tests."""

from __future__ import annotations

import torch

from components.engine.disagg.transport.decode_side import DecodeSide
from components.engine.disagg.transport.prefill_side import PrefillSide
from components.engine.disagg.transport.runs import check_within
from protocol.kv_side_channel import PROBE_BYTES, PROBE_SLOTS, Hello, Welcome

BASE, SIZE = 0x10000, 0x10000
RUNS = [(BASE, 256), (BASE + 1024, 256)]
PEER_RUNS = [(BASE + 4096, 512)]  # same bytes, different split
PROBE_BASE = 0x40000


class FakeNixlError(Exception):
    pass


class FakeNixl:
    errors = (FakeNixlError,)
    name = "fake-agent"
    ucx_error_handling = "peer"  # what a Hello that does not name a mode declares

    def __init__(self, write_state: str = "PROC") -> None:
        # The KV path probe's buffer, as NixlEndpoint registers it (path_probe.py)
        self.probe = torch.zeros(PROBE_SLOTS * PROBE_BYTES, dtype=torch.uint8)
        self.probe_base = PROBE_BASE
        self.peers: set[str] = set()
        self.write_state = write_state
        self.states: dict[int, str] = {}
        self.writes: list[tuple] = []
        self.released: list[int] = []
        self.inbox: list[tuple[str, bytes]] = []  # (sending agent, notification)

    def check_local(self, runs, what):
        check_within(runs, BASE, SIZE, what)

    def add_peer(self, name, metadata):
        if metadata == b"bad":
            raise FakeNixlError("NIXL_ERR_MISMATCH")
        self.peers.add(name)

    def has_peer(self, name):
        return name in self.peers

    def write(self, peer, src, dst, notif):
        handle = len(self.writes)
        self.writes.append((peer, src, dst, notif))
        self.states[handle] = self.write_state
        return handle, self.write_state

    def state(self, handle):
        return self.states[handle]

    def release(self, handle):
        self.released.append(handle)
        return True

    def remove_peer(self, name):
        self.peers.discard(name)

    def notifs(self):
        out, self.inbox = self.inbox, []
        return out


class FakeServer:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def send(self, identity, msg):
        self.sent.append((identity, msg))
        return True


class FakeClient:
    def __init__(self, connected: bool = True) -> None:
        self.sent: list[tuple[tuple[str, int], object]] = []
        self.connected = connected
        self.forgotten: list[tuple[str, int]] = []

    def send(self, endpoint, msg):
        self.sent.append((endpoint, msg))
        return True

    def forget(self, endpoint):
        self.forgotten.append(endpoint)

    def hello_nonce(self, endpoint):
        return b""

    def was_connected(self, endpoint):
        return self.connected


def make_prefill(write_state="PROC", bootstrap_timeout=5.0, transfer_timeout=5.0):
    nixl, server, events = FakeNixl(write_state), FakeServer(), []
    side = PrefillSide(nixl, server, bootstrap_timeout, transfer_timeout, events.append)
    side.on_message(b"id-d", Hello(agent_name="dec", agent_metadata=b"md", pool_base=BASE,
                                   pool_bytes=SIZE))
    assert server.sent == [(b"id-d", Welcome(agent_name="fake-agent"))]
    server.sent.clear()
    return side, nixl, server, events


def make_decode(connected=True, transfer_timeout=5.0, probe=False):
    nixl, client, events = FakeNixl(), FakeClient(connected), []
    side = DecodeSide(nixl, client, transfer_timeout, events.append, probe=probe)
    return side, nixl, client, events


def welcome(side, endpoint=("127.0.0.1", 5000), agent="pre"):
    """The prefill at ``endpoint`` accepted the decode's Hello: its notifications now count."""
    side.on_message(endpoint, Welcome(agent_name=agent))


# --- runs -------------------------------------------------------------------------------------
