"""Decode side of the KV transport: register destination runs, wait for the WRITE, release safely.

A room is WAITING until the prefill's NIXL notification arrives (``KVArrived``) or it fails
(``TransferFailed``). A failed or aborted room is RELEASING until no prefill can write into its
pages any more (``RoomReleased``): the prefill acknowledged, or aborted the room itself, or its
connection dropped, or it refused our Hello, or it never connected, or a grace of
``transfer_timeout`` passed. A prefill that said ``Holding`` (a WRITE NIXL will not let go of)
replaces that grace by the long holding backstop.

A room fails ``notif_grace`` (5 s) after the prefill's ``Written`` if the notification has not
come (``notif_lost_message``: peer and transport); without ``Written``, after
``transfer_timeout`` (``--cpu-transfer-timeout``, 30 s).

Which NIXL notifications count: decode_notifs.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from components.engine.disagg.transport.auth import welcome_ok
from components.engine.disagg.transport.bootstrap import Endpoint
from components.engine.disagg.transport.bootstrap_client import BootstrapClient
from components.engine.disagg.transport.decode_notifs import counts, note_written, read_notifs
from components.engine.disagg.transport.decode_room import DecodeRoom
from components.engine.disagg.transport.events import (
    HOLD_BACKSTOP_FACTOR, Event, FailureKind, KVArrived, RoomReleased, TransferFailed, abort_kind,
    notif_lost_message,
)
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.path_probe import DecodeProbes
from components.engine.disagg.transport.peers import Throttle
from components.engine.disagg.transport.runs import Run
from protocol.kv_side_channel import (
    Abort, AbortAck, Holding, KVNotif, Probed, Refused, Register, Welcome, Written,
)

logger = logging.getLogger(__name__)


class DecodeSide:
    def __init__(self, nixl: NixlEndpoint, client: BootstrapClient, transfer_timeout: float,
                 emit: Callable[[Event], None], secret: bytes | None = None,
                 throttle: Throttle | None = None, probe: bool = False) -> None:
        self._nixl = nixl
        self._client = client
        self._transfer_timeout = transfer_timeout
        self._emit = emit
        self._secret = secret
        self._throttle = throttle or Throttle()
        self._rooms: dict[int, DecodeRoom] = {}
        self._prefills: dict[Endpoint, str] = {}  # endpoint -> its NIXL agent (from Welcome)
        self._probes = DecodeProbes(nixl, client.send, probe)

    # --- engine calls -------------------------------------------------------------------------
    def add_decode(self, room: int, host: str, port: int, runs: list[Run], rid: str,
                   skip: int = 0) -> None:
        if room in self._rooms:
            raise ValueError(f"room {room} is already registered")
        valid_port = isinstance(port, int) and 0 < port < 65536
        if not isinstance(host, str) or not host or not valid_port:
            raise ValueError(f"room {room}: invalid bootstrap address {host!r}:{port!r}")
        self._nixl.check_local(runs, f"room {room} (rid {rid})")
        now = time.monotonic()
        r = DecodeRoom(room, rid, (host, port), now + self._transfer_timeout, now, runs=list(runs),
                       skip=skip)
        self._rooms[room] = r
        path = self._probes.status(r.endpoint, now)
        if path == "broken":
            r.queued = True  # never registered: released as soon as it fails
            self._fail(r, self._probes.failure(r.endpoint), FailureKind.PATH_BROKEN)
        elif path == "probing":
            r.queued = True
        else:
            self._register(r)

    def _register(self, r: DecodeRoom) -> None:
        r.queued = False
        if not self._client.send(r.endpoint, Register(r.room, self._nixl.name, r.runs, r.skip)):
            self._fail(r, f"could not reach the prefill bootstrap server "
                          f"{r.endpoint[0]}:{r.endpoint[1]}", FailureKind.PEER_LOST)

    def abort(self, room: int, message: str, invalid: bool = False) -> None:
        r = self._rooms.get(room)
        if r is not None and not r.releasing:
            logger.info("room %s (rid %s): aborted locally: %s", room, r.rid, message)
            self._start_release(r, message)

    def abort_unregistered(self, room: int, host: str, port: int, message: str) -> None:
        """A room this engine gave up before registering it: tell its prefill now, so the
        prefill frees its pages at once instead of when its bootstrap wait runs out. No pages
        were offered, so nothing waits for the answer."""
        if room in self._rooms:
            self.abort(room, message)
        else:
            self._client.send((host, port), Abort(room, self._nixl.name, message))

    @property
    def busy(self) -> bool:
        return bool(self._rooms) or self._probes.probing_since() is not None

    def progress_since(self) -> float | None:
        """Start of the newest pending room or probe, or None: while any is pending, UCX
        wire-up and notifications need this (passive) side to progress too."""
        return max((r.since for r in self._rooms.values()),
                   default=self._probes.probing_since())

    def next_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self._rooms.values()]
        probe = self._probes.next_deadline()
        if probe is not None:
            deadlines.append(probe)
        return min(deadlines, default=None)

    # --- inputs -------------------------------------------------------------------------------
    def on_message(self, endpoint: Endpoint, msg) -> None:
        if isinstance(msg, Written):
            note_written(self._rooms.get(msg.room), endpoint, self._transfer_timeout)
            return
        if isinstance(msg, (Welcome, Refused)):
            self._on_greeting(endpoint, msg)
            return
        if isinstance(msg, Probed):
            self._probes.on_probed(endpoint, msg)
            return
        r = self._rooms.get(msg.room)
        if r is None or r.endpoint != endpoint:
            logger.debug("room %s: late %s from %s:%s ignored",
                         msg.room, type(msg).__name__, *endpoint)
            return
        if isinstance(msg, Holding):
            r.held = True
            if r.releasing:
                r.deadline = r.since + HOLD_BACKSTOP_FACTOR * self._transfer_timeout
            return
        if isinstance(msg, Abort) and not r.releasing:
            # The prefill sends Abort only once none of its WRITEs of the room is in flight.
            why = msg.message if msg.invalid else f"prefill aborted the KV transfer: {msg.message}"
            kind = FailureKind.INVALID if msg.invalid else abort_kind(why)
            self._emit(TransferFailed(r.room, why, kind))
        elif isinstance(msg, AbortAck) and not r.releasing:
            return
        self._release(r)

    def _on_greeting(self, endpoint: Endpoint, msg: Welcome | Refused) -> None:
        if isinstance(msg, Welcome) and welcome_ok(self._secret,
                                                   self._client.hello_nonce(endpoint) or b"", msg):
            self._prefills[endpoint] = msg.agent_name
            self._probes.on_welcome(endpoint, time.monotonic())
            for r in [r for r in self._rooms.values() if r.endpoint == endpoint and r.early]:
                early, r.early = r.early, []
                for agent, notif in early:
                    self._on_notif(r, agent, notif)
            return
        if isinstance(msg, Welcome):
            reason = "its welcome is not signed with our side-channel secret"
        else:
            reason = msg.reason
        logger.warning("KV side channel: prefill %s:%s refused or failed the handshake: %s",
                       *endpoint, reason)
        # It never loaded our metadata, so nothing of it can write into these pages.
        self._client.forget(endpoint)
        self._lose(endpoint, f"prefill {endpoint[0]}:{endpoint[1]} refused this decode: {reason}",
                   FailureKind.REFUSED)

    def on_disconnect(self, endpoint: Endpoint) -> None:
        self._lose(endpoint, f"lost the connection to the prefill bootstrap server "
                             f"{endpoint[0]}:{endpoint[1]}", FailureKind.PEER_LOST)

    def _lose(self, endpoint: Endpoint, message: str, kind: FailureKind) -> None:
        self._prefills.pop(endpoint, None)
        self._probes.forget(endpoint)
        for r in [r for r in self._rooms.values() if r.endpoint == endpoint]:
            if not r.releasing:
                self._emit(TransferFailed(r.room, message, kind))
            self._release(r)

    def progress(self, now: float) -> None:
        for agent, notif in read_notifs(self._nixl, self._throttle):
            r = self._rooms.get(notif.room)
            if r is not None:
                self._on_notif(r, agent, notif)
            elif not self._probes.on_notif(agent, notif):
                logger.debug("room %s: late KV notification ignored", notif.room)
        for endpoint, good in self._probes.settle(now, self._prefills):
            self._path_decided(endpoint, good)
        for r in [r for r in self._rooms.values() if r.deadline <= now]:
            self._expire(r, now)

    def _expire(self, r: DecodeRoom, now: float) -> None:
        """``r``'s deadline passed: release it (RELEASING) or fail it (WAITING)."""
        if r.releasing:
            logger.warning("room %s: prefill never acknowledged the abort; releasing "
                           "after %g s", r.room, now - r.since)
            if r.held:
                logger.error("room %s: releasing pages the prefill said a WRITE may still "
                             "reach, after %g s", r.room, now - r.since)
            self._release(r)
        elif r.written:
            msg = notif_lost_message(r.endpoint, self._prefills.get(r.endpoint), r.room,
                                     now - r.written)
            logger.warning("room %s (rid %s): %s", r.room, r.rid, msg)
            self._fail(r, msg, FailureKind.TIMED_OUT)
        else:
            self._fail(r, f"timed out waiting for KV of room {r.room} from prefill "
                          f"{r.endpoint[0]}:{r.endpoint[1]} after {self._transfer_timeout:g} s",
                       FailureKind.TIMED_OUT)

    def _on_notif(self, r: DecodeRoom, agent: str, notif: KVNotif) -> None:
        if not counts(r, agent, notif, self._prefills.get(r.endpoint), self._throttle):
            return
        if r.room not in self._rooms:
            return  # an earlier notification of the batch already ended it
        if r.releasing:
            # The notification follows the data: the WRITE is over, the pages are free.
            self._release(r)
        else:
            del self._rooms[r.room]
            self._emit(KVArrived(r.room, notif.first_token, notif.logprob, notif.cached_tokens,
                                 tuple(notif.choices)))

    def _path_decided(self, endpoint: Endpoint, good: bool) -> None:
        """The KV path probe of ``endpoint`` is over: send the rooms' Registers, or fail them."""
        for r in [r for r in self._rooms.values() if r.endpoint == endpoint and r.queued]:
            if good:
                self._register(r)
            else:
                self._fail(r, self._probes.failure(endpoint), FailureKind.PATH_BROKEN)

    # --- endings ------------------------------------------------------------------------------
    def _fail(self, r: DecodeRoom, message: str, kind: FailureKind) -> None:
        logger.info("room %s (rid %s) failed: %s", r.room, r.rid, message)
        self._emit(TransferFailed(r.room, message, kind))
        self._start_release(r, message)

    def _start_release(self, r: DecodeRoom, message: str) -> None:
        """Ask the prefill to stop; keep the pages until it acknowledges (or the grace ends)."""
        r.releasing = True
        r.since = time.monotonic()
        if r.queued:  # never registered: no prefill can write into its pages
            self._client.send(r.endpoint, Abort(r.room, self._nixl.name, message))
            self._release(r)
            return
        grace = self._transfer_timeout * (HOLD_BACKSTOP_FACTOR if r.held else 1)
        r.deadline = r.since + grace
        sent = self._client.send(r.endpoint, Abort(r.room, self._nixl.name, message))
        if not sent:
            self._release(r)
        elif not self._client.was_connected(r.endpoint) and not self._shares_endpoint(r):
            # The Register may still sit in the socket's queue: closing the socket (linger 0)
            # drops it, so no prefill can ever write into these pages.
            self._client.forget(r.endpoint)
            self._prefills.pop(r.endpoint, None)
            self._release(r)
        # Otherwise the prefill may have the Register (or get it before the queued Abort):
        # keep the pages until it acknowledges, or the grace ends.

    def _shares_endpoint(self, r: DecodeRoom) -> bool:
        return any(o.endpoint == r.endpoint for o in self._rooms.values() if o is not r)

    def _release(self, r: DecodeRoom) -> None:
        if self._rooms.pop(r.room, None) is not None:
            self._emit(RoomReleased(r.room))
            if not any(o.endpoint == r.endpoint for o in self._rooms.values()):
                self._probes.abandon(r.endpoint)

    def close(self) -> None:
        self._rooms.clear()
