"""The room watch over real loopback TCP: a decode's claims and releases reach the prefill's
watch, a dropped, silent or malformed connection ends every room it claimed, an unclaimed leg
ends at its claim deadline, and nobody but the claimer ends a claimed room."""

from __future__ import annotations

import asyncio

import pytest

from components.worker.rooms.claims import RoomClaims
from components.worker.rooms.watch import DROPPED, RoomWatchServer
from protocol.room_watch import HEADER, Claim, Release, frame

pytestmark = pytest.mark.timeout(10)

ROOM = 12345


async def watch_server(**kwargs) -> RoomWatchServer:
    server = RoomWatchServer("127.0.0.1", **kwargs)
    await server.start()
    return server


def claims_for(server: RoomWatchServer, ping_s: float = 2.0) -> RoomClaims:
    async def lookup(host: str, port: int):
        return ("127.0.0.1", server.port)

    return RoomClaims(lookup, ping_s=ping_s)


async def until(predicate, timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_a_cancelled_decode_half_ends_the_watched_leg():
    server = await watch_server()
    claims = claims_for(server)
    gone = server.watch(ROOM)
    claim = await claims.claim("pre", 1, ROOM)
    await until(lambda: server.counters["claims"] == 1)
    claim.release("cancelled", "client stopped")
    end = await asyncio.wait_for(gone, 5)
    assert (end.room, end.outcome, end.message) == (ROOM, "cancelled", "client stopped")
    await claims.close()
    await server.close()


async def test_a_leg_arriving_after_its_release_finds_the_room_ended():
    server = await watch_server()
    claims = claims_for(server)
    (await claims.claim("pre", 1, ROOM)).release("invalid", "n: must be 1")
    await until(lambda: server.counters["ended"] == 1)
    gone = server.watch(ROOM)
    assert gone.done() and gone.result().outcome == "invalid"
    assert gone.result().message == "n: must be 1"
    await claims.close()
    await server.close()


async def test_a_done_release_ends_nothing():
    server = await watch_server()
    claims = claims_for(server)
    gone = server.watch(ROOM)
    (await claims.claim("pre", 1, ROOM)).release("done")
    await until(lambda: server.counters["claims"] == 0)
    assert not gone.done() and server.counters["ended"] == 0
    server.unwatch(ROOM, gone)
    assert server.counters["legs"] == 0
    await claims.close()
    await server.close()


async def test_a_dropped_connection_ends_every_room_it_claimed():
    server = await watch_server()
    claims = claims_for(server)
    legs = [server.watch(ROOM + i) for i in range(3)]
    for i in range(3):
        await claims.claim("pre", 1, ROOM + i)
    await until(lambda: server.counters["claims"] == 3)
    await claims.close()  # as a killed decode's sockets close
    ends = await asyncio.wait_for(asyncio.gather(*legs), 5)
    assert [(e.outcome, e.message) for e in ends] == [("failed", DROPPED)] * 3
    await server.close()


async def test_a_silent_connection_holding_claims_ends_its_rooms():
    server = await watch_server(silence_s=0.3)
    claims = claims_for(server, ping_s=60.0)  # a hung decode: no pings
    gone = server.watch(ROOM)
    await claims.claim("pre", 1, ROOM)
    assert (await asyncio.wait_for(gone, 5)).outcome == "failed"
    await claims.close()
    await server.close()


async def test_pings_keep_a_quiet_connection_alive():
    server = await watch_server(silence_s=0.3)
    claims = claims_for(server, ping_s=0.05)
    gone = server.watch(ROOM)
    await claims.claim("pre", 1, ROOM)
    await asyncio.sleep(0.8)
    assert not gone.done()
    await claims.close()
    await server.close()


async def test_an_unclaimed_leg_ends_at_its_claim_deadline_and_a_claim_stops_it():
    server = await watch_server(claim_timeout_s=0.3)
    claims = claims_for(server)
    unclaimed, claimed = server.watch(ROOM), server.watch(ROOM + 1)
    await claims.claim("pre", 1, ROOM + 1)
    end = await asyncio.wait_for(unclaimed, 5)
    assert end.outcome == "failed" and "no decode claimed the room" in end.message
    await asyncio.sleep(0.4)
    assert not claimed.done()
    await claims.close()
    await server.close()


async def test_only_the_claiming_connection_ends_a_claimed_room():
    server = await watch_server()
    owner, other = claims_for(server), claims_for(server)
    gone = server.watch(ROOM)
    await owner.claim("pre", 1, ROOM)
    await until(lambda: server.counters["claims"] == 1)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame(Claim(ROOM)) + frame(Release(ROOM, "cancelled", "guessed")))
    await writer.drain()
    await asyncio.sleep(0.2)
    assert not gone.done()
    writer.close()
    await owner.close()
    await other.close()
    await server.close()


async def test_a_malformed_frame_drops_the_connection_and_its_rooms():
    server = await watch_server()
    gone = server.watch(ROOM)
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame(Claim(ROOM)) + HEADER.pack(3) + b"\xc1\xc1\xc1")
    await writer.drain()
    assert (await asyncio.wait_for(gone, 5)).outcome == "failed"
    writer.close()
    await server.close()


async def test_an_unreachable_watch_leaves_the_request_unclaimed():
    async def nowhere(host: str, port: int):
        return None

    assert await RoomClaims(nowhere).claim("pre", 1, ROOM) is None
    server = await watch_server()
    port = server.port
    await server.close()
    claims = claims_for(server)
    server.port = port  # closed: nothing listens there now
    assert await claims.claim("pre", 1, ROOM) is None


async def test_closing_the_watch_ends_its_open_connections_quietly():
    """A worker's shutdown closes the watch while decodes are still connected: their connection
    tasks end by themselves, not cancelled by the loop's teardown (whose stream callback, on
    Python 3.11, logs "Exception in callback" with a CancelledError)."""
    server = await watch_server()
    claims = claims_for(server)
    await claims.claim("pre", 1, ROOM)
    await until(lambda: server.counters["claims"] == 1)
    serving = {t for t in asyncio.all_tasks() if "_serve" in repr(t.get_coro())}
    assert serving
    await server.close()
    assert all(t.done() and not t.cancelled() for t in serving)
    assert server.counters["claims"] == 0  # its rooms ended with the connection
    await claims.close()
