"""Prefill side, the WRITE half: post one NIXL WRITE per room, settle it, time it out.

Every room ends with exactly one ``TransferDone`` or ``TransferFailed``, and only once no WRITE
of it is in flight: a WRITE that timed out and that NIXL will not release keeps the room (and,
through ``Holding``, the decode's pages) until NIXL lets go, or the holding backstop passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from components.engine.disagg.transport.bootstrap import BootstrapServer
from components.engine.disagg.transport.events import (
    HOLD_BACKSTOP_FACTOR,
    Event,
    FailureKind,
    TransferDone,
    TransferFailed,
)
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.peers import Tombstones
from components.engine.disagg.transport.runs import (
    Run, coalesce, pair_runs, skip_tokens, total_bytes,
)
from protocol.kv_side_channel import (
    Abort, AbortAck, ChoiceFirst, FirstLogprob, Holding, KVNotif, Written, encode,
)

logger = logging.getLogger(__name__)

MAX_RECENT = 4096  # DONE rooms remembered, so a lost notification can un-count its WRITE


@dataclass
class Registration:
    identity: bytes  # the connection that registered the room: the only one that may abort it
    agent: str
    runs: list[Run]
    arrived: float
    skip: int = 0  # the prompt's first tokens the decode already holds: not written


@dataclass
class PrefillRoom:
    room: int
    rid: str
    runs: list[Run]
    first_token: int
    created: float
    reg: Registration | None = None
    handle: object | None = None
    started: float = 0.0
    # Set when the room is given up while its WRITE is in flight: reported once the WRITE settles.
    abort_message: str | None = None
    abort_kind: FailureKind = FailureKind.ABORTED  # the kind of ``abort_message``
    ack_to: bytes | None = None  # connection that aborted the room and waits for AbortAck
    holding_since: float | None = None  # the WRITE timed out and NIXL would not release it
    nbytes: int = 0  # what the WRITE moves
    logprob: FirstLogprob | None = None  # the first token's, when the request asked for them
    cached_tokens: int = 0  # prompt tokens this prefill served from its prefix cache
    choices: tuple[ChoiceFirst, ...] = ()  # n > 1: the further choices' first tokens
    tokens: int = 0  # how many tokens ``runs`` hold (0: not given; then no decode may skip any)
    elapsed: float = 0.0  # post to DONE, once DONE

    def give_up(self, message: str, kind: FailureKind) -> None:
        """Its WRITE is in flight: report the first reason it was given up once it settles."""
        if not self.abort_message:
            self.abort_message, self.abort_kind = message, kind


@dataclass
class TransferTotals:
    """Completed WRITEs since start: count, bytes and seconds (post to DONE), for the worker's
    metrics. Written on the engine thread only; other threads read whole ints and floats."""

    writes: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    last_seconds: float = 0.0


class PrefillWrites:
    """Rooms whose KV is ready (``add_prefill``), and their WRITEs. A room that fails is
    remembered in ``tombstones`` (shared with, and expired by, the owning ``PrefillSide``)."""

    def __init__(self, nixl: NixlEndpoint, server: BootstrapServer, bootstrap_timeout: float,
                 transfer_timeout: float, emit: Callable[[Event], None],
                 tombstones: Tombstones) -> None:
        self._nixl = nixl
        self._server = server
        self._bootstrap_timeout = bootstrap_timeout
        self._transfer_timeout = transfer_timeout
        self._hold_backstop = HOLD_BACKSTOP_FACTOR * transfer_timeout
        self._emit = emit
        self._rooms: dict[int, PrefillRoom] = {}
        self._tombstones = tombstones
        self._zombies: list[object] = []  # settled handles NIXL refused to release; retried
        self._recent: dict[int, PrefillRoom] = {}  # rooms DONE lately, oldest first
        self.totals = TransferTotals()

    @property
    def busy(self) -> bool:
        return bool(self._rooms or self._zombies)

    @property
    def counters(self) -> dict[str, int]:
        return {"rooms": len(self._rooms), "zombies": len(self._zombies)}

    def get(self, room: int) -> PrefillRoom | None:
        return self._rooms.get(room)

    def add(self, r: PrefillRoom) -> None:
        """Take ``r`` on; it WRITEs once ``start`` is called with its registration set."""
        self._rooms[r.room] = r

    def busy_agents(self) -> set[str]:
        """Decode agents with a WRITE in flight (NIXL must not unload them)."""
        return {r.reg.agent for r in self._rooms.values() if r.handle is not None}

    def progress_since(self) -> float | None:
        """Start of the newest WRITE in flight, or None (only check_xfer_state moves it along)."""
        starts = [r.started for r in self._rooms.values() if r.handle is not None]
        if self._zombies:
            starts.append(0.0)
        return max(starts, default=None)

    def next_deadline(self) -> float | None:
        waits = [r.created + self._bootstrap_timeout for r in self._rooms.values() if r.reg is None]
        return min(waits, default=None)

    # --- WRITEs ----------------------------------------------------------------------------
    def start(self, r: PrefillRoom) -> None:
        reg = r.reg
        try:
            src, dst = coalesce(*pair_runs(skip_tokens(r.runs, r.tokens, reg.runs, reg.skip), reg.runs))
            notif = encode(KVNotif(room=r.room, first_token=r.first_token, logprob=r.logprob,
                                   cached_tokens=r.cached_tokens, choices=list(r.choices)))
            r.handle, state = self._nixl.write(reg.agent, src, dst, notif)
        except (ValueError, *self._nixl.errors) as exc:
            logger.warning("room %s (rid %s): KV WRITE not started: %s", r.room, r.rid, exc)
            self.fail(r, f"KV transfer to decode failed: {exc}", FailureKind.NIXL_ERROR,
                      tell_decode=True)
            return
        r.started = time.monotonic()
        r.nbytes = total_bytes(src)
        logger.debug("room %s: WRITE of %d runs posted (%s)", r.room, len(src), state)
        self._settle(r, state)

    def progress(self, now: float) -> None:
        for r in list(self._rooms.values()):
            if r.handle is not None:
                self._settle(r, self._nixl.state(r.handle))
                if r.handle is not None and now - r.started > self._transfer_timeout:
                    self._time_out(r, now)
            elif r.reg is None and now - r.created > self._bootstrap_timeout:
                self.fail(r, f"timed out waiting for decode to register room {r.room} after "
                             f"{self._bootstrap_timeout:g} s", FailureKind.TIMED_OUT,
                          tell_decode=False)
        self._zombies = [h for h in self._zombies if not self._nixl.release(h)]

    def _time_out(self, r: PrefillRoom, now: float) -> None:
        """Cancel a WRITE that took too long. While NIXL will not release its handle the WRITE
        may still land, so the room (and, told ``Holding``, the decode's pages) stays held."""
        message = f"timed out writing KV to decode after {self._transfer_timeout:g} s"
        if self._nixl.release(r.handle):
            r.handle = None
            self.fail(r, message, FailureKind.TIMED_OUT, tell_decode=True)
        elif r.holding_since is None:
            r.holding_since = now
            r.give_up(message, FailureKind.TIMED_OUT)
            logger.warning("room %s (rid %s): NIXL will not release the timed-out WRITE; "
                           "keeping the pages on both sides until it does", r.room, r.rid)
            self._server.send(r.ack_to or r.reg.identity, Holding(r.room, self._nixl.name))
        elif now - r.holding_since > self._hold_backstop:
            logger.error("room %s (rid %s): NIXL still holds the WRITE after %g s; freeing the "
                         "pages anyway", r.room, r.rid, now - r.holding_since)
            self._zombies.append(r.handle)
            r.handle = None
            self.fail(r, r.abort_message, r.abort_kind, tell_decode=True)

    def _settle(self, r: PrefillRoom, state: str) -> None:
        if state == "PROC":
            return
        if not self._nixl.release(r.handle):  # settled: nothing is in flight any more
            self._zombies.append(r.handle)
        r.handle = None
        if r.abort_message is not None:
            self.fail(r, r.abort_message, r.abort_kind, tell_decode=r.ack_to is None)
        elif state == "DONE":
            del self._rooms[r.room]
            self._count_done(r)
            self._recent[r.room] = r  # until the decode could still say it never arrived
            if len(self._recent) > MAX_RECENT:
                del self._recent[next(iter(self._recent))]
            # The notification went out with the WRITE; this wakes decode's side-channel poll
            # so it reads it now instead of after its next poll slice (up to 1 ms later).
            self._server.send(r.reg.identity, Written(r.room, self._nixl.name))
            logger.debug("room %s (rid %s): KV WRITE done", r.room, r.rid)
            self._emit(TransferDone(r.room))
        else:
            self.fail(r, "KV transfer to decode failed (NIXL error)", FailureKind.NIXL_ERROR,
                      tell_decode=True)

    def _count_done(self, r: PrefillRoom) -> None:
        t = self.totals
        t.last_seconds = r.elapsed = time.monotonic() - r.started
        t.writes += 1
        t.nbytes += r.nbytes
        t.seconds += t.last_seconds

    def notif_lost(self, room: int, identity: bytes, message: str) -> None:
        """The decode says a WRITE counted done never announced itself (its notification was
        lost): stop counting it, and say which peer and transport."""
        r = self._recent.get(room)
        if r is None or r.reg.identity != identity:
            return
        del self._recent[room]
        t = self.totals
        t.writes, t.nbytes, t.seconds = t.writes - 1, t.nbytes - r.nbytes, t.seconds - r.elapsed
        logger.warning("room %s (rid %s): the KV WRITE to decode agent %r was DONE here, but its "
                       "NIXL notification (UCX active message) never reached the decode; no "
                       "longer counted as a transfer done. The decode said: %s",
                       room, r.rid, r.reg.agent, message)

    def fail(self, r: PrefillRoom, message: str, kind: FailureKind, tell_decode: bool) -> None:
        """End a room with no WRITE in flight: tell decode, remember it, report it."""
        self._rooms.pop(r.room, None)
        if r.ack_to is not None:
            self._server.send(r.ack_to, AbortAck(r.room, self._nixl.name))
        elif tell_decode and r.reg is not None:
            self._server.send(r.reg.identity, Abort(r.room, self._nixl.name, message))
        self._tombstones.add(r.room, message, kind)
        logger.info("room %s (rid %s) failed: %s", r.room, r.rid, message)
        self._emit(TransferFailed(r.room, message, kind))

    def close(self) -> None:
        for r in self._rooms.values():
            if r.handle is not None and not self._nixl.release(r.handle):
                self._zombies.append(r.handle)
        self._rooms.clear()
        for h in self._zombies:
            self._nixl.release(h)
        self._zombies.clear()
