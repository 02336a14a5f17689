"""The prefill worker's room watch server (docs/reference/room-watch.md).

Each decode worker process keeps one TCP connection here and claims the room of every decode
half it serves; when that half ends early it releases the room with its outcome. A room whose
claim is released as gone, or whose connection drops or falls silent, ends: the prefill leg
watching it (`watch`) is told at once, and a leg that arrives later finds it ended and computes
nothing. The engine does not matter: the prefill handler aborts its engine request by rid.
The other way, `deliver` sends a room's prompt logprobs to the connection that claimed it, and
`leg_ended` tells it the room's prefill leg sent its last item, and a ``ProbeKV`` runs the
engine's half of a KV path probe (`prober`, `components/worker/rooms/kv_probe.py`) and answers
``KVProbed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Awaitable, Callable, Optional

import msgspec

from protocol.room_watch import (
    GONE, HEADER, MAX_LOGPROBS_FRAME_BYTES, Claim, KVProbed, LegEnded, ProbeKV, PromptLogprobs,
    Release, ToPrefill, decode, frame, frame_length,
)

logger = logging.getLogger(__name__)

# A room ended before its prefill leg arrived is remembered this long (the frontend sends
# both legs at once; this only has to outlast the request plane's delivery).
ENDED_TTL_S = 120.0
MAX_ENDED = 1 << 16
MAX_CLAIMS_PER_CONNECTION = 1 << 16
# Prompt logprobs of rooms not claimed yet, kept for their claim (the decode claims before its
# engine joins the room, so this only bridges two connections' delivery order).
MAX_UNDELIVERED = 256
DROPPED = "the decode worker's room-watch connection dropped"
CLOSE_WAIT_S = 2.0  # for the connections' tasks to see their sockets closed
# The engine's half of a KV path probe of a room: "" once through, else why it failed.
Prober = Callable[[int], Awaitable[str]]
NO_PROBER = "this prefill's engine runs no KV path probe over the room watch"


class _Connection:
    def __init__(self, peer: str, writer: asyncio.StreamWriter) -> None:
        self.peer = peer
        self.rooms: set[int] = set()
        self.writer = writer
        self.task = asyncio.current_task()  # the server's task serving it
        self.probe: Optional[asyncio.Task[None]] = None  # one at a time per connection


class RoomWatchServer:
    def __init__(self, host: str, port: int = 0, silence_s: float = 10.0,
                 claim_timeout_s: float = 10.0) -> None:
        self.host = host
        self.port = port
        self._silence_s = silence_s  # a connection holding claims that says nothing this long
        # A leg whose room no decode claims this long ends: its decode died before claiming it
        # (the frontend sends the decode leg within milliseconds of the prefill's first item).
        # 0: wait for the engine's own bootstrap timeout instead.
        self._claim_timeout_s = claim_timeout_s
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        self._server: Optional[asyncio.AbstractServer] = None
        self._claims: dict[int, _Connection] = {}
        self._ended: OrderedDict[int, tuple[Release, float]] = OrderedDict()
        self._legs: dict[int, asyncio.Future[Release]] = {}
        # frames for rooms whose decode half has not claimed them yet, sent on its claim
        self._held: OrderedDict[int, list[bytes]] = OrderedDict()
        self._connections: set[_Connection] = set()
        self.prober: Optional[Prober] = None  # set once the engine is up (rooms/wiring.py)

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise RuntimeError(f"cannot bind the room watch to {self.host}:{self.port}: "
                               f"{exc}") from exc
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("room watch listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        """Stop listening and close every decode's connection; wait (bounded) for their tasks
        to end by themselves: left to the loop's teardown, each would be cancelled, and
        Python 3.11's stream callback logs a cancelled connection task as an exception."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        conns = list(self._connections)  # each task discards its own as it ends
        for conn in conns:
            if conn.probe is not None:
                conn.probe.cancel()
            conn.writer.close()
        tasks = [conn.task for conn in conns if conn.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)

    @property
    def counters(self) -> dict[str, int]:
        return {"claims": len(self._claims), "ended": len(self._ended), "legs": len(self._legs)}

    def watch(self, room: int) -> "asyncio.Future[Release]":
        """A future that resolves with the decode's Release when the room ends (already
        resolved if it has). `unwatch` when the leg is over."""
        gone: asyncio.Future[Release] = asyncio.get_running_loop().create_future()
        ended = self._ended.get(room)
        if ended is not None:
            gone.set_result(ended[0])
            return gone
        self._legs[room] = gone
        if room not in self._claims and self._claim_timeout_s > 0:
            self._deadlines[room] = asyncio.get_running_loop().call_later(
                self._claim_timeout_s, self._unclaimed, room)
        return gone

    def unwatch(self, room: int, gone: "asyncio.Future[Release]") -> None:
        if self._legs.get(room) is gone:
            del self._legs[room]
            self._cancel_deadline(room)
        gone.cancel()

    def deliver(self, msg: PromptLogprobs) -> None:
        """Send a room's prompt logprobs to its decode half (on its claim, if still to come)."""
        body = frame(msg)
        if len(body) - HEADER.size > MAX_LOGPROBS_FRAME_BYTES:
            body = frame(PromptLogprobs(msg.room, error=(
                f"the prompt logprobs take {len(body)} bytes, over the room watch's "
                f"{MAX_LOGPROBS_FRAME_BYTES}")))
        self._send(msg.room, body)

    def leg_ended(self, room: int) -> None:
        """Tell the room's decode half that its prefill leg sent its last item (on its claim,
        if still to come)."""
        self._send(room, frame(LegEnded(room)))

    def _send(self, room: int, body: bytes) -> None:
        owner = self._claims.get(room)
        if owner is not None:
            owner.writer.write(body)  # the transport buffers it; the loop never blocks
            return
        self._held.setdefault(room, []).append(body)  # the decode half claims it in a moment
        while len(self._held) > MAX_UNDELIVERED:
            self._held.popitem(last=False)

    def _unclaimed(self, room: int) -> None:
        self._deadlines.pop(room, None)
        logger.warning("room %s: no decode claimed it within %.0f s", room, self._claim_timeout_s)
        self._end(Release(room, "failed",
                          f"no decode claimed the room within {self._claim_timeout_s:g} s"))

    def _cancel_deadline(self, room: int) -> None:
        deadline = self._deadlines.pop(room, None)
        if deadline is not None:
            deadline.cancel()

    # --- the connections ----------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(str(writer.get_extra_info("peername")), writer)
        self._connections.add(conn)
        try:
            while True:
                timeout = self._silence_s if conn.rooms else None
                header = await asyncio.wait_for(reader.readexactly(HEADER.size), timeout)
                body = await asyncio.wait_for(reader.readexactly(frame_length(header)),
                                              self._silence_s)
                self._on_message(conn, decode(body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the decode closed the connection or died
        except TimeoutError:
            logger.warning("room watch: %s held %d rooms and was silent for %.0f s",
                           conn.peer, len(conn.rooms), self._silence_s)
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.warning("room watch: dropped %s after a malformed frame: %s", conn.peer, exc)
        finally:
            writer.close()
            self._connections.discard(conn)
            self._dropped(conn)

    def _on_message(self, conn: _Connection, msg: ToPrefill) -> None:
        if isinstance(msg, ProbeKV):
            self._probe(conn, msg.room)
        elif isinstance(msg, Claim):
            owner = self._claims.get(msg.room)
            if owner is None and msg.room not in self._ended \
                    and len(conn.rooms) < MAX_CLAIMS_PER_CONNECTION:
                self._claims[msg.room] = conn
                conn.rooms.add(msg.room)
                self._cancel_deadline(msg.room)
                for body in self._held.pop(msg.room, []):
                    conn.writer.write(body)
        elif isinstance(msg, Release):
            owner = self._claims.get(msg.room)
            if owner is not None and owner is not conn:
                return  # another decode's room: not this connection's to end
            if owner is conn:
                del self._claims[msg.room]
                conn.rooms.discard(msg.room)
            if msg.outcome in GONE:
                self._end(msg)

    def _probe(self, conn: _Connection, room: int) -> None:
        if conn.probe is not None and not conn.probe.done():
            conn.writer.write(frame(KVProbed(room, "a probe from this decode is under way")))
            return
        conn.probe = asyncio.ensure_future(self._run_probe(conn, room))

    async def _run_probe(self, conn: _Connection, room: int) -> None:
        error = await self.prober(room) if self.prober is not None else NO_PROBER
        if not conn.writer.is_closing():
            conn.writer.write(frame(KVProbed(room, error[:4096])))

    def _dropped(self, conn: _Connection) -> None:
        if conn.probe is not None:
            conn.probe.cancel()
        for room in conn.rooms:
            if self._claims.get(room) is conn:
                del self._claims[room]
                self._end(Release(room, "failed", DROPPED))
        conn.rooms.clear()

    def _end(self, release: Release) -> None:
        gone = self._legs.pop(release.room, None)
        if gone is not None and not gone.done():
            logger.info("room %s ended by its decode (%s)", release.room, release.outcome)
            gone.set_result(release)
        now = time.monotonic()
        self._ended[release.room] = (release, now + ENDED_TTL_S)
        self._ended.move_to_end(release.room)
        while self._ended and (len(self._ended) > MAX_ENDED
                               or next(iter(self._ended.values()))[1] < now):
            self._ended.popitem(last=False)
