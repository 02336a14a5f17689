"""Prefill side of the KV transport: meet decode registrations, WRITE, report, honour aborts.

A room starts WRITING when both ``add_prefill`` (local KV ready) and the decode's ``Register``
are present, in either order (the WRITEs themselves: ``prefill_writes.py``). Only the connection
that introduced an agent may speak for it, and only the connection that registered a room may
abort it (``peers.py``); registrations from a connection that drops are never written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from components.engine.disagg.transport.bootstrap import BootstrapServer
from components.engine.disagg.transport.events import (
    NOTIF_LOST,
    Event,
    FailureKind,
    TransferFailed,
    abort_kind,
)
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.peers import (
    MAX_PENDING,
    MAX_PENDING_PER_PEER,
    Peer,
    PeerTable,
    Throttle,
    Tombstones,
)
from components.engine.disagg.transport.prefill_writes import (
    PrefillRoom,
    PrefillWrites,
    Registration,
    TransferTotals,
)
from components.engine.disagg.transport.probe_writes import ProbeWrites
from components.engine.disagg.transport.runs import Run
from protocol.kv_side_channel import (
    Abort, AbortAck, ChoiceFirst, FirstLogprob, Hello, Holding, KVLayout, Probe, Register,
)

logger = logging.getLogger(__name__)


class PrefillSide:
    """The side channel's rules (peers, registrations, aborts, tombstones) around the rooms'
    WRITEs, which ``PrefillWrites`` posts, settles and times out."""

    def __init__(self, nixl: NixlEndpoint, server: BootstrapServer, bootstrap_timeout: float,
                 transfer_timeout: float, emit: Callable[[Event], None],
                 layout: KVLayout | None = None, secret: bytes | None = None,
                 throttle: Throttle | None = None) -> None:
        self._nixl = nixl
        self._server = server
        self._emit = emit
        self._throttle = throttle or Throttle()
        # Orphan registrations and tombstones (rooms given up) are kept this long, then dropped.
        self._horizon = bootstrap_timeout + transfer_timeout
        self._tombstones = Tombstones(self._horizon, self._throttle)
        self._writes = PrefillWrites(nixl, server, bootstrap_timeout, transfer_timeout, emit,
                                     self._tombstones)
        self._peers = PeerTable(nixl, layout, secret, self._throttle)
        self._probes = ProbeWrites(nixl, server)
        self._registrations: dict[int, Registration] = {}
        self._pending: dict[bytes, int] = {}  # connection -> its registrations waiting

    @property
    def counters(self) -> dict[str, int]:
        """Sizes of every table a peer can grow (all capped; see peers.py)."""
        return {"peers": len(self._peers), "registrations": len(self._registrations),
                "tombstones": len(self._tombstones), "nonces": self._peers.nonces,
                **self._writes.counters}

    @property
    def totals(self) -> TransferTotals:
        return self._writes.totals

    @property
    def busy(self) -> bool:
        return self._writes.busy or self._probes.busy

    def progress_since(self) -> float | None:
        return max(filter(None, (self._writes.progress_since(), self._probes.started_since())),
                   default=None)

    def next_deadline(self) -> float | None:
        return min(filter(None, (self._writes.next_deadline(), self._probes.next_deadline())),
                   default=None)

    def progress(self, now: float) -> None:
        """Move the WRITEs along, then forget what is older than the horizon."""
        self._writes.progress(now)
        self._probes.progress(now)
        self._tombstones.expire(now)
        self._expire_registrations(now)

    def close(self) -> None:
        self._writes.close()
        self._probes.close()

    # --- engine calls -------------------------------------------------------------------------
    def add_prefill(self, room: int, runs: list[Run], first_token: int, rid: str,
                    logprob: FirstLogprob | None = None, cached_tokens: int = 0,
                    choices: tuple[ChoiceFirst, ...] = (), tokens: int = 0) -> None:
        if self._writes.get(room) is not None:
            raise ValueError(f"room {room} is already being transferred")
        self._nixl.check_local(runs, f"room {room} (rid {rid})")
        tomb = self._tombstones.pop(room)
        if tomb is not None:
            self._emit(TransferFailed(room, tomb.message, tomb.kind))
            return
        r = PrefillRoom(room, rid, list(runs), int(first_token), time.monotonic(),
                        logprob=logprob, cached_tokens=int(cached_tokens), choices=choices,
                        tokens=tokens)
        self._writes.add(r)
        r.reg = self._take_registration(room)
        if r.reg is not None:
            self._writes.start(r)

    def abort(self, room: int, message: str, invalid: bool = False) -> None:
        """``invalid``: the engine refused the request itself (a 400); the decode says so too."""
        r = self._writes.get(room)
        if r is None:
            # Aborted before its KV was ready: fail the decode's registration now or when it comes.
            reg = self._take_registration(room)
            if reg is not None:
                self._server.send(reg.identity, Abort(room, self._nixl.name, message, invalid))
            self._tombstones.add(room, message, abort_kind(message), invalid)
            return
        if r.handle is not None:
            r.give_up(message, abort_kind(message))
        else:
            self._writes.fail(r, message, abort_kind(message), tell_decode=True)

    # --- side channel -------------------------------------------------------------------------
    def on_message(self, identity: bytes, msg) -> None:
        if isinstance(msg, Hello):
            self._server.send(identity,
                              self._peers.hello(identity, msg, self._writes.busy_agents()))
            return
        peer = self._peers.peer_of(identity)
        if peer is None or peer.name != msg.agent_name:
            why = ("prefill does not know this decode agent (no accepted hello on this "
                   "connection)" if peer is None else
                   f"this connection speaks for agent {peer.name!r}, not {msg.agent_name!r}")
            if isinstance(msg, Register):
                self._refuse(identity, msg.room, why)
            return
        if isinstance(msg, Register):
            self._on_register(identity, peer, msg)
        elif isinstance(msg, Probe):
            self._probes.on_probe(identity, peer, msg)
        else:
            self._on_decode_abort(identity, msg)

    def on_disconnect(self, identity: bytes) -> None:
        """The connection dropped: its decode released its pages, so its waiting registrations
        must never be written."""
        self._peers.disconnected(identity, self._writes.busy_agents())
        for room, reg in list(self._registrations.items()):
            if reg.identity == identity:
                self._take_registration(room)
                self._tombstones.add(room, "the decode's side-channel connection dropped",
                                     FailureKind.PEER_LOST)

    def _refuse(self, identity: bytes, room: int, why: str) -> None:
        self._throttle.warn("register", "KV side channel: refused a registration of room %s: %s",
                            room, why)
        self._server.send(identity, Abort(room, self._nixl.name, why))

    def _on_register(self, identity: bytes, peer: Peer, msg: Register) -> None:
        tomb = self._tombstones.get(msg.room)
        if tomb is not None and tomb.by not in (None, identity):
            # Given up unregistered by another connection: the decode registering it owns it
            # (a peer that guesses a live room must not fail someone else's request).
            self._tombstones.pop(msg.room)
        elif tomb is not None:
            self._server.send(identity, Abort(msg.room, self._nixl.name, tomb.message,
                                              tomb.invalid))
            return
        try:
            self._peers.check_runs(peer, list(msg.runs), msg.room)
        except ValueError as exc:
            self._refuse(identity, msg.room, str(exc))
            return
        r = self._writes.get(msg.room)
        other = self._registrations.get(msg.room) or (r.reg if r is not None else None)
        if other is not None:
            if other.identity != identity:  # the owner's own duplicate is harmless: ignored
                self._refuse(identity, msg.room, "room already registered by another decode")
            return
        reg = Registration(identity, msg.agent_name, list(msg.runs), time.monotonic(),
                           msg.skip_tokens)
        if r is not None:
            r.reg = reg
            self._writes.start(r)
        elif (self._pending.get(identity, 0) >= MAX_PENDING_PER_PEER
              or len(self._registrations) >= MAX_PENDING and not self._evict_for(identity)):
            self._refuse(identity, msg.room, "too many registrations waiting for this prefill")
        else:
            self._registrations[msg.room] = reg
            self._pending[identity] = self._pending.get(identity, 0) + 1

    def _evict_for(self, identity: bytes) -> bool:
        """All registrations are taken: free one of the peer holding the most, if that is not
        ``identity`` (so peers that flood cannot lock out one that does not)."""
        heaviest = max(self._pending, key=self._pending.__getitem__)
        if self._pending[heaviest] <= self._pending.get(identity, 0) + 1:
            return False
        room = next(k for k, g in self._registrations.items() if g.identity == heaviest)
        self._take_registration(room)
        why = "evicted: too many registrations waiting for this prefill"
        self._tombstones.add(room, why, FailureKind.REFUSED)
        self._refuse(heaviest, room, why)
        return True

    def _on_decode_abort(self, identity: bytes, msg: Abort) -> None:
        if msg.message.startswith(NOTIF_LOST):
            self._writes.notif_lost(msg.room, identity, msg.message)
        message = f"aborted by decode: {msg.message}"
        kind = abort_kind(message)
        r = self._writes.get(msg.room)
        reg = self._registrations.get(msg.room)
        if r is not None and r.reg is not None and r.reg.identity == identity:
            r.ack_to = identity
            if r.handle is None:
                self._writes.fail(r, message, kind, tell_decode=False)
                return
            r.give_up(message, kind)
            # Tell decode a WRITE is in flight: keep the pages past its grace, until our ack.
            self._server.send(identity, Holding(msg.room, self._nixl.name))
        elif reg is not None and reg.identity == identity:
            # Not started here: remember, so a later add_prefill fails fast.
            self._take_registration(msg.room)
            self._tombstones.add(msg.room, message, kind)
            self._server.send(identity, AbortAck(msg.room, self._nixl.name))
        elif reg is None and (r is None or r.reg is None):
            # Nobody registered it: a decode that gave the room up before registering it (or a
            # late abort of a finished room). Stop it now rather than at the bootstrap timeout.
            if r is not None:
                r.ack_to = identity
                self._writes.fail(r, message, kind, tell_decode=False)
                return
            self._tombstones.add(msg.room, message, kind, by=identity)
            self._server.send(identity, AbortAck(msg.room, self._nixl.name))
        else:
            self._throttle.warn("abort", "KV side channel: refused an abort of room %s from a "
                                "connection that did not register it", msg.room)

    def _expire_registrations(self, now: float) -> None:
        for room in [k for k, g in self._registrations.items() if now - g.arrived > self._horizon]:
            logger.info("room %s: dropped a decode registration the prefill never started", room)
            self._take_registration(room)

    def _take_registration(self, room: int) -> Registration | None:
        reg = self._registrations.pop(room, None)
        if reg is not None:
            left = self._pending.pop(reg.identity) - 1
            if left:
                self._pending[reg.identity] = left
        return reg
