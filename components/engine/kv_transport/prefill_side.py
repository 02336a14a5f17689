"""Prefill side of the KV transport: meet decode registrations, WRITE, report, honour aborts.

A room starts WRITING when both ``add_prefill`` (local KV ready) and the decode's ``Register``
are present, in either order. Every room added with ``add_prefill`` ends with exactly one
``TransferDone`` or ``TransferFailed``, and only once no WRITE of it is in flight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from components.engine.kv_transport.bootstrap import BootstrapServer
from components.engine.kv_transport.events import Event, TransferDone, TransferFailed
from components.engine.kv_transport.nixl_endpoint import NixlEndpoint
from components.engine.kv_transport.runs import Run, pair_runs
from protocol.kv_side_channel import Abort, AbortAck, Hello, KVNotif, Register, encode

logger = logging.getLogger(__name__)


@dataclass
class _Registration:
    agent: str
    runs: list[Run]
    arrived: float


@dataclass
class _Room:
    room: int
    rid: str
    runs: list[Run]
    first_token: int
    created: float
    reg: _Registration | None = None
    handle: object | None = None
    started: float = 0.0
    # Set when the room is given up while its WRITE is in flight: reported once the WRITE settles.
    abort_message: str | None = None
    ack_to: str | None = None  # decode agent that aborted the room and waits for AbortAck


class PrefillSide:
    def __init__(self, nixl: NixlEndpoint, server: BootstrapServer, bootstrap_timeout: float,
                 transfer_timeout: float, emit: Callable[[Event], None]) -> None:
        self._nixl = nixl
        self._server = server
        self._bootstrap_timeout = bootstrap_timeout
        self._transfer_timeout = transfer_timeout
        self._emit = emit
        # Orphan registrations and tombstones (rooms given up) are kept this long, then dropped.
        self._horizon = bootstrap_timeout + transfer_timeout
        self._rooms: dict[int, _Room] = {}
        self._registrations: dict[int, _Registration] = {}
        self._tombstones: dict[int, tuple[float, str]] = {}
        self._identities: dict[str, bytes] = {}  # decode agent -> ROUTER identity
        self._zombies: list[object] = []  # handles NIXL refused to release; retried

    # --- engine calls -------------------------------------------------------------------------
    def add_prefill(self, room: int, runs: list[Run], first_token: int, rid: str) -> None:
        if room in self._rooms:
            raise ValueError(f"room {room} is already being transferred")
        self._nixl.check_local(runs, f"room {room} (rid {rid})")
        tomb = self._tombstones.pop(room, None)
        if tomb is not None:
            self._emit(TransferFailed(room, tomb[1]))
            return
        r = _Room(room, rid, list(runs), int(first_token), time.monotonic())
        self._rooms[room] = r
        r.reg = self._registrations.pop(room, None)
        if r.reg is not None:
            self._start(r)

    def abort(self, room: int, message: str) -> None:
        r = self._rooms.get(room)
        if r is None:
            # Aborted before its KV was ready: fail the decode's registration now or when it comes.
            reg = self._registrations.pop(room, None)
            if reg is not None:
                self._send(reg.agent, Abort(room, self._nixl.name, message))
            self._tombstones[room] = (time.monotonic() + self._horizon, message)
            return
        if r.handle is not None:
            r.abort_message = r.abort_message or message
        else:
            self._finish_failed(r, message, tell_decode=True)

    @property
    def busy(self) -> bool:
        return bool(self._rooms or self._zombies)

    def progress_since(self) -> float | None:
        """Start of the newest WRITE in flight, or None (only check_xfer_state moves it along)."""
        starts = [r.started for r in self._rooms.values() if r.handle is not None]
        if self._zombies:
            starts.append(0.0)
        return max(starts, default=None)

    def next_deadline(self) -> float | None:
        waits = [r.created + self._bootstrap_timeout for r in self._rooms.values() if r.reg is None]
        return min(waits, default=None)

    # --- side channel -------------------------------------------------------------------------
    def on_message(self, identity: bytes, msg) -> None:
        if isinstance(msg, Hello):
            self._on_hello(identity, msg)
            return
        if not self._nixl.has_peer(msg.agent_name):
            logger.warning("room %s: message from unknown decode agent %s (no hello)",
                           msg.room, msg.agent_name)
            reply = Abort(msg.room, self._nixl.name, "prefill does not know this decode agent")
            self._server.send(identity, reply)
            return
        self._identities[msg.agent_name] = identity
        if isinstance(msg, Register):
            self._on_register(msg)
        else:
            self._on_decode_abort(msg)

    def _on_hello(self, identity: bytes, msg: Hello) -> None:
        try:
            self._nixl.add_peer(msg.agent_name, msg.agent_metadata)
        except (ValueError, *self._nixl.errors) as exc:
            logger.warning("hello from decode agent %s rejected: %s", msg.agent_name, exc)
            return
        self._identities[msg.agent_name] = identity
        logger.info("decode agent %s connected", msg.agent_name)

    def _on_register(self, msg: Register) -> None:
        tomb = self._tombstones.get(msg.room)
        if tomb is not None:
            self._send(msg.agent_name, Abort(msg.room, self._nixl.name, tomb[1]))
            return
        reg = _Registration(msg.agent_name, list(msg.runs), time.monotonic())
        r = self._rooms.get(msg.room)
        if r is None:
            self._registrations[msg.room] = reg
        elif r.reg is None:
            r.reg = reg
            self._start(r)
        else:
            logger.warning("room %s: duplicate decode registration ignored", msg.room)

    def _on_decode_abort(self, msg: Abort) -> None:
        message = f"aborted by decode: {msg.message}"
        r = self._rooms.get(msg.room)
        if r is None:
            # Not started here (or already finished): remember, so a later add_prefill fails fast.
            self._registrations.pop(msg.room, None)
            self._tombstones[msg.room] = (time.monotonic() + self._horizon, message)
            self._send(msg.agent_name, AbortAck(msg.room, self._nixl.name))
        else:
            r.ack_to = msg.agent_name
            if r.handle is not None:
                r.abort_message = message
            else:
                self._finish_failed(r, message, tell_decode=False)

    # --- transfers ----------------------------------------------------------------------------
    def _start(self, r: _Room) -> None:
        reg = r.reg
        try:
            src, dst = pair_runs(r.runs, reg.runs)
            notif = encode(KVNotif(room=r.room, first_token=r.first_token))
            r.handle, state = self._nixl.write(reg.agent, src, dst, notif)
        except (ValueError, *self._nixl.errors) as exc:
            logger.warning("room %s (rid %s): KV WRITE not started: %s", r.room, r.rid, exc)
            self._finish_failed(r, f"KV transfer to decode failed: {exc}", tell_decode=True)
            return
        r.started = time.monotonic()
        logger.debug("room %s: WRITE of %d runs posted (%s)", r.room, len(src), state)
        self._settle(r, state)

    def progress(self, now: float) -> None:
        for r in list(self._rooms.values()):
            if r.handle is not None:
                self._settle(r, self._nixl.state(r.handle))
                if r.handle is not None and now - r.started > self._transfer_timeout:
                    self._drop_handle(r)
                    self._finish_failed(
                        r, f"timed out writing KV to decode after {self._transfer_timeout:g} s",
                        tell_decode=True)
            elif r.reg is None and now - r.created > self._bootstrap_timeout:
                self._finish_failed(
                    r, f"timed out waiting for decode to register room {r.room} "
                       f"after {self._bootstrap_timeout:g} s", tell_decode=False)
        self._zombies = [h for h in self._zombies if not self._nixl.release(h)]
        self._expire(now)

    def _settle(self, r: _Room, state: str) -> None:
        if state == "PROC":
            return
        self._drop_handle(r)
        if r.abort_message is not None:
            self._finish_failed(r, r.abort_message, tell_decode=r.ack_to is None)
        elif state == "DONE":
            del self._rooms[r.room]
            logger.debug("room %s (rid %s): KV WRITE done", r.room, r.rid)
            self._emit(TransferDone(r.room))
        else:
            self._finish_failed(r, "KV transfer to decode failed (NIXL error)", tell_decode=True)

    def _drop_handle(self, r: _Room) -> None:
        if not self._nixl.release(r.handle):
            self._zombies.append(r.handle)
        r.handle = None

    def _finish_failed(self, r: _Room, message: str, tell_decode: bool) -> None:
        """End a room with no WRITE in flight: tell decode, remember it, report it."""
        self._rooms.pop(r.room, None)
        if r.ack_to is not None:
            self._send(r.ack_to, AbortAck(r.room, self._nixl.name))
        elif tell_decode and r.reg is not None:
            self._send(r.reg.agent, Abort(r.room, self._nixl.name, message))
        self._tombstones[r.room] = (time.monotonic() + self._horizon, message)
        logger.info("room %s (rid %s) failed: %s", r.room, r.rid, message)
        self._emit(TransferFailed(r.room, message))

    def _send(self, agent: str, msg) -> None:
        identity = self._identities.get(agent)
        if identity is not None:
            self._server.send(identity, msg)

    def _expire(self, now: float) -> None:
        for room in [k for k, (until, _) in self._tombstones.items() if until < now]:
            del self._tombstones[room]
        for room in [k for k, g in self._registrations.items() if now - g.arrived > self._horizon]:
            logger.info("room %s: dropped a decode registration the prefill never started", room)
            del self._registrations[room]

    def close(self) -> None:
        for r in self._rooms.values():
            if r.handle is not None:
                self._drop_handle(r)
        self._rooms.clear()
        for h in self._zombies:
            self._nixl.release(h)
        self._zombies.clear()
