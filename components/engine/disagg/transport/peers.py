"""Prefill side: who is speaking on the side channel, and how much each peer may make us hold.

A decode peer is a NIXL agent name bound to the ZMQ connection (ROUTER identity) whose Hello
introduced it. Only that connection may use the name, and a connection has one name; the
binding ends when the connection drops (the bootstrap server reports it), after which the same
agent may say Hello again on a new connection. The Hello's pool (base, size) bounds every
Register of the peer, its layout and UCX error handling must equal ours, and with a secret it
must be signed.

Tables are capped (``MAX_*``); what does not fit is refused, never grown. Refusals are logged at
WARNING through ``Throttle``, at most once per ``Throttle.every_s`` per kind.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

from components.engine.disagg.transport.auth import HelloChecker, sign_welcome
from components.engine.disagg.transport.events import FailureKind
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.runs import Run, check_within
from protocol.kv_side_channel import Hello, KVLayout, Refused, Welcome

logger = logging.getLogger(__name__)

MAX_PEERS = 256  # decode agents known at once (bound or detached)
MAX_PENDING_PER_PEER = 1024  # registrations one peer may leave waiting for the prefill
MAX_PENDING = 8192  # ... all peers together
MAX_TOMBSTONES = 8192  # rooms given up, remembered so late messages fail fast


class Throttle:
    """WARNING logs that cannot flood: one line per kind per ``every_s``, with a count."""

    every_s = 10.0

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def warn(self, kind: str, fmt: str, *args) -> None:
        now = time.monotonic()
        last, suppressed = self._last.get(kind, (-self.every_s, 0))
        if now - last < self.every_s:
            self._last[kind] = (last, suppressed + 1)
            return
        self._last[kind] = (now, 0)
        if suppressed:
            fmt += " (%d similar messages suppressed)"
            args = (*args, suppressed)
        logger.warning(fmt, *args)


@dataclass
class Peer:
    name: str
    identity: bytes | None  # None: detached (its connection dropped)
    metadata: bytes
    pool_base: int
    pool_bytes: int
    probe_base: int = 0  # the decode's probe buffer (path_probe.py); 0: none declared
    pending: int = 0  # registrations waiting for add_prefill


class PeerTable:
    def __init__(self, nixl: NixlEndpoint, layout: KVLayout | None, secret: bytes | None,
                 throttle: Throttle) -> None:
        self._nixl = nixl
        self._layout = layout
        self._auth = HelloChecker(secret)
        self._secret = secret
        self._throttle = throttle
        self._peers: dict[str, Peer] = {}
        self._by_identity: dict[bytes, str] = {}

    def __len__(self) -> int:
        return len(self._peers)

    @property
    def nonces(self) -> int:
        return len(self._auth)

    def peer_of(self, identity: bytes) -> Peer | None:
        name = self._by_identity.get(identity)
        return self._peers[name] if name is not None else None

    def hello(self, identity: bytes, msg: Hello, busy: set[str]) -> Welcome | Refused:
        """Bind ``msg.agent_name`` to ``identity``, or say why not. ``busy``: agents with a
        WRITE in flight (never unloaded from NIXL)."""
        reason = self._refusal(identity, msg, busy)
        if reason is not None:
            self._throttle.warn("hello", "KV side channel: refused hello from decode agent %r: %s",
                                msg.agent_name, reason)
            return Refused(agent_name=self._nixl.name, reason=reason)
        self._by_identity[identity] = msg.agent_name
        self._peers[msg.agent_name] = Peer(msg.agent_name, identity, msg.agent_metadata,
                                           msg.pool_base, msg.pool_bytes, msg.probe_base)
        logger.info("decode agent %s connected", msg.agent_name)
        return sign_welcome(self._secret, msg.nonce, self._nixl.name)

    def _refusal(self, identity: bytes, msg: Hello, busy: set[str]) -> str | None:
        why = self._auth.check(msg, time.time())  # first: tell a stranger nothing else
        if why is not None:
            return why
        if msg.ucx_error_handling != self._nixl.ucx_error_handling:
            return (f"UCX error handling mismatch: prefill uses {self._nixl.ucx_error_handling!r}, "
                    f"decode {msg.ucx_error_handling!r} (--cpu-kv-ucx-error-handling must match)")
        if msg.layout != self._layout:
            return (f"KV layout mismatch: prefill has {_describe(self._layout)}, "
                    f"decode has {_describe(msg.layout)}")
        bound = self._by_identity.get(identity)
        if bound is not None and bound != msg.agent_name:
            return f"this connection already speaks for agent {bound!r}"
        old = self._peers.get(msg.agent_name)
        if old is not None and old.identity not in (None, identity):
            return f"agent name {msg.agent_name!r} is in use by another connection"
        for other in self._peers.values():
            if other.name != msg.agent_name and other.metadata == msg.agent_metadata:
                return f"this NIXL metadata belongs to agent {other.name!r}"
        if old is None and not self._make_room(busy):
            return f"the prefill already serves {MAX_PEERS} decode agents"
        if old is not None and old.metadata != msg.agent_metadata:
            if msg.agent_name in busy:
                return f"agent {msg.agent_name!r} restarted while a WRITE to it is in flight"
            self._forget(old)
        try:
            self._nixl.add_peer(msg.agent_name, msg.agent_metadata)
        except (ValueError, *self._nixl.errors) as exc:
            return f"unusable NIXL metadata: {exc}"
        return None

    def _make_room(self, busy: set[str]) -> bool:
        if len(self._peers) < MAX_PEERS:
            return True
        for peer in self._peers.values():  # oldest first
            if peer.identity is None and peer.pending == 0 and peer.name not in busy:
                self._forget(peer)
                return True
        return False

    def _forget(self, peer: Peer) -> None:
        del self._peers[peer.name]
        if peer.identity is not None:
            self._by_identity.pop(peer.identity, None)
        self._nixl.remove_peer(peer.name)

    def disconnected(self, identity: bytes, busy: set[str]) -> str | None:
        """The connection dropped: forget its agent, unloading it from NIXL (a decode that
        comes back says Hello again; a restarted one is another agent), unless a WRITE to it
        is in flight (``busy``): then it stays loaded, detached, until the table needs room."""
        name = self._by_identity.pop(identity, None)
        if name is None:
            return None
        peer = self._peers[name]
        peer.identity = None
        if name in busy:
            logger.info("decode agent %s disconnected (kept: a WRITE to it is in flight)", name)
        else:
            self._forget(peer)
            logger.info("decode agent %s disconnected and forgotten", name)
        return name

    def check_runs(self, peer: Peer, runs: list[Run], room: int) -> None:
        """ValueError unless ``runs`` lie inside the pool the peer's Hello declared."""
        check_within(runs, peer.pool_base, peer.pool_bytes, f"room {room}: decode runs")


def _describe(layout: KVLayout | None) -> str:
    return layout.describe() if layout is not None else "no declared layout"


class Tomb(NamedTuple):
    until: float
    message: str
    kind: FailureKind  # what a late add_prefill of the room reports
    invalid: bool  # the request itself was refused (a 400)
    by: bytes | None  # the connection of a decode that gave the room up unregistered


class Tombstones:
    """Rooms given up (room -> Tomb), so a late Register or add_prefill fails fast.
    Capped: the oldest is forgotten first (that room then waits out its own timeout instead)."""

    def __init__(self, horizon: float, throttle: Throttle) -> None:
        self._horizon = horizon
        self._throttle = throttle
        self._rooms: dict[int, Tomb] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def add(self, room: int, message: str, kind: FailureKind, invalid: bool = False,
            by: bytes | None = None) -> None:
        self._rooms.pop(room, None)
        if len(self._rooms) >= MAX_TOMBSTONES:
            del self._rooms[next(iter(self._rooms))]
            self._throttle.warn("tombstones", "KV transport: over %d rooms given up within %g s; "
                                "forgetting the oldest", MAX_TOMBSTONES, self._horizon)
        self._rooms[room] = Tomb(time.monotonic() + self._horizon, message, kind, invalid, by)

    def get(self, room: int) -> Tomb | None:
        return self._rooms.get(room)

    def message(self, room: int) -> str | None:
        entry = self._rooms.get(room)
        return entry.message if entry is not None else None

    def pop(self, room: int) -> Tomb | None:
        return self._rooms.pop(room, None)

    def expire(self, now: float) -> None:
        while self._rooms:
            room, tomb = next(iter(self._rooms.items()))
            if tomb.until >= now:
                return  # insertion order is expiry order
            del self._rooms[room]
