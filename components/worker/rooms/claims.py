"""The decode worker's side of the room watch (docs/reference/room-watch.md).

One connection per prefill worker's watch server, opened on first use and kept: `claim` sends
the room's Claim as the decode half arrives, and the returned claim's `release` sends how the
half ended. While a connection holds claims it pings, so a hung decode's rooms end too. A watch
server that cannot be reached costs nothing but the guarantee: the request goes on unclaimed.
The prefill sends a claimed room's prompt logprobs back on the same connection
(`RoomClaim.prompt_logprobs`), and the end of its leg where the decode waits for it
(`RoomClaim.leg_ended`), and its half of a KV path probe (`Link.probe`, `kv_probe.py`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional

import msgspec

from protocol.room_watch import (
    HEADER, MAX_LOGPROBS_FRAME_BYTES, Claim, KVProbed, LegEnded, Outcome, Ping, ProbeKV,
    PromptLogprobs, Release, ToPrefill, decode_to_decode, frame, frame_length,
)

logger = logging.getLogger(__name__)

Address = tuple[str, int]
# Where the prefill worker whose bootstrap server is (host, port) keeps its room watch.
Lookup = Callable[[str, int], Awaitable[Optional[Address]]]
CONNECT_TIMEOUT_S = 2.0


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 ping_s: float) -> None:
        self.rooms: set[int] = set()
        # each claimed room's prompt logprobs, when the prefill sends them
        self.logprobs: dict[int, asyncio.Future[PromptLogprobs]] = {}
        # each claimed room's prefill leg end (True), or False when none can come any more
        self.legs: dict[int, asyncio.Future[bool]] = {}
        # each probe's answer: the prefill's error ("" when its half went through)
        self.probes: dict[int, asyncio.Future[str]] = {}
        self._writer = writer
        self._wake = asyncio.Event()
        self._tasks = (asyncio.ensure_future(self._ping(ping_s)),
                       asyncio.ensure_future(self._until_closed(reader)))

    @property
    def open(self) -> bool:
        return not self._writer.is_closing()

    def send(self, msg: ToPrefill) -> None:
        # A write never blocks the loop: the transport buffers it (a few bytes per request).
        if self.open:
            self._writer.write(frame(msg))

    def claimed(self, room: int) -> None:
        self.rooms.add(room)
        waiting = self.logprobs[room] = asyncio.get_running_loop().create_future()
        leg = self.legs[room] = asyncio.get_running_loop().create_future()
        if not self.open:
            waiting.set_result(PromptLogprobs(room, error="the room watch connection closed"))
            leg.set_result(False)
        self._wake.set()

    def probe(self, room: int) -> "asyncio.Future[str]":
        """Ask the prefill to run its half of a probe of `room`; resolves with its error
        ("" once through), or why none can come (the connection closed)."""
        answer = self.probes[room] = asyncio.get_running_loop().create_future()
        answer.add_done_callback(lambda _: self.probes.pop(room, None))
        if self.open:
            self.send(ProbeKV(room))
        else:
            answer.set_result("the room watch connection closed")
        return answer

    def released(self, room: int) -> None:
        self.rooms.discard(room)
        for waiting in (self.logprobs.pop(room, None), self.legs.pop(room, None)):
            if waiting is not None:
                waiting.cancel()

    async def _ping(self, every_s: float) -> None:
        while self.open:
            if not self.rooms:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(every_s)
            self.send(Ping())

    async def _until_closed(self, reader: asyncio.StreamReader) -> None:
        """The server writes only prompt logprobs and leg ends: EOF or an error means the
        prefill worker went away, a malformed frame that it cannot be trusted."""
        why = "the prefill worker's room watch closed the connection"
        try:
            while True:
                header = await reader.readexactly(HEADER.size)
                body = await reader.readexactly(frame_length(header, MAX_LOGPROBS_FRAME_BYTES))
                msg = decode_to_decode(body)
                if isinstance(msg, KVProbed):
                    answer = self.probes.get(msg.room)
                    if answer is not None and not answer.done():
                        answer.set_result(msg.error)
                    continue
                ended = isinstance(msg, LegEnded)
                waiting = (self.legs if ended else self.logprobs).get(msg.room)
                if waiting is not None and not waiting.done():
                    waiting.set_result(True if ended else msg)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            why = f"the prefill worker's room watch sent a malformed frame: {exc}"
            logger.warning("room watch: %s", why)
        self.close(why)

    def close(self, why: str = "the room watch connection closed") -> None:
        for task in self._tasks:
            task.cancel()
        self._writer.close()
        for room, waiting in self.logprobs.items():
            if not waiting.done():
                waiting.set_result(PromptLogprobs(room, error=why))
        for leg in self.legs.values():
            if not leg.done():
                leg.set_result(False)
        for answer in list(self.probes.values()):
            if not answer.done():
                answer.set_result(why)


class RoomClaim:
    """One decode half's claim; `release` once, when the half ends."""

    def __init__(self, link: Link, room: int) -> None:
        self._link = link
        self.room = room
        self._released = False

    def prompt_logprobs(self) -> "asyncio.Future[PromptLogprobs]":
        """Resolves with the prefill's PromptLogprobs for this room, or one whose `error` says
        why none will come (the connection closed first)."""
        return self._link.logprobs[self.room]

    def leg_ended(self) -> "asyncio.Future[bool]":
        """Resolves True when the prefill says its leg of this room sent its last item (it
        says so for `n > 1` frontend-orchestrated legs only), False when the connection closed
        first."""
        return self._link.legs[self.room]

    def release(self, outcome: Outcome, message: str = "") -> None:
        if self._released:
            return
        self._released = True
        self._link.released(self.room)
        self._link.send(Release(self.room, outcome, message[:4096]))


class RoomClaims:
    def __init__(self, lookup: Lookup, ping_s: float = 2.0) -> None:
        self._lookup = lookup
        self._ping_s = ping_s
        self._links: dict[Address, Link] = {}
        self._opening: dict[Address, asyncio.Future[Optional[Link]]] = {}

    async def claim(self, host: str, port: int, room: int) -> Optional[RoomClaim]:
        """Claim `room` at the prefill whose bootstrap server is host:port; None when its
        watch cannot be reached (logged)."""
        link = await self.link(host, port)
        if link is None:
            return None
        link.send(Claim(room))
        link.claimed(room)
        return RoomClaim(link, room)

    async def link(self, host: str, port: int) -> Optional[Link]:
        """The connection to the watch of the prefill whose bootstrap server is host:port;
        None when it cannot be reached (logged)."""
        address = await self._lookup(host, port)
        return None if address is None else await self._link(address)

    async def _link(self, address: Address) -> Optional[Link]:
        link = self._links.get(address)
        if link is not None and link.open:
            return link
        opening = self._opening.get(address)
        if opening is None:
            opening = self._opening[address] = asyncio.ensure_future(self._connect(address))
            opening.add_done_callback(lambda _: self._opening.pop(address, None))
        return await asyncio.shield(opening)

    async def _connect(self, address: Address) -> Optional[Link]:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*address),
                                                    CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            logger.warning("room watch at %s:%d unreachable (%s); its requests go unclaimed",
                           address[0], address[1], exc)
            return None
        self._links[address] = Link(reader, writer, self._ping_s)
        return self._links[address]

    async def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
