"""Prompt logprobs over the room watch, real loopback TCP: the prefill's `deliver` reaches the
claim of the room's decode half (also when it comes before the claim), and only that claim; a
connection that closes, or a prefill that sends what no decode can read, ends the wait with a
reason instead of leaving it hanging."""

from __future__ import annotations

import asyncio

import pytest

from components.worker.rooms import watch as watch_module
from components.worker.rooms.claims import RoomClaims
from protocol.room_watch import HEADER, Claim, PromptLogprobs, frame
from tests.unit.worker.test_room_watch import ROOM, claims_for, until, watch_server

pytestmark = pytest.mark.timeout(10)

SENT = PromptLogprobs(ROOM, tokens=[(None, 7), (-1.5, 8)], top=[None, [(-0.7, 4), (-1.5, 8)]])


async def test_a_claimed_room_gets_the_prefills_prompt_logprobs():
    server = await watch_server()
    claims = claims_for(server)
    mine, other = (await claims.claim("pre", 1, ROOM), await claims.claim("pre", 1, ROOM + 1))
    await until(lambda: server.counters["claims"] == 2)
    server.deliver(SENT)
    assert await asyncio.wait_for(mine.prompt_logprobs(), 5) == SENT
    assert not other.prompt_logprobs().done()
    await claims.close()
    await server.close()


async def test_prompt_logprobs_sent_before_the_claim_wait_for_it():
    server = await watch_server()
    claims = claims_for(server)
    server.deliver(SENT)
    claim = await claims.claim("pre", 1, ROOM)
    assert await asyncio.wait_for(claim.prompt_logprobs(), 5) == SENT
    await claims.close()
    await server.close()


@pytest.mark.parametrize("reply, why", [
    (b"", "closed the connection"),  # the prefill worker went away
    (HEADER.pack(3) + b"\xc1\xc1\xc1", "malformed frame"),
])
async def test_a_connection_that_ends_or_goes_bad_ends_the_wait_with_why(reply, why):
    async def serve(reader, writer):  # a prefill's watch that answers the claim with `reply`
        await reader.readexactly(len(frame(Claim(ROOM))))
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def lookup(host: str, port_: int):
        return ("127.0.0.1", port)

    claims = RoomClaims(lookup)
    claim = await claims.claim("pre", 1, ROOM)
    got = await asyncio.wait_for(claim.prompt_logprobs(), 5)
    assert got.tokens == [] and why in got.error
    await claims.close()
    server.close()
    await server.wait_closed()


async def test_prompt_logprobs_too_big_for_a_frame_arrive_as_an_error(monkeypatch):
    monkeypatch.setattr(watch_module, "MAX_LOGPROBS_FRAME_BYTES", 64)
    server = await watch_server()
    claims = claims_for(server)
    claim = await claims.claim("pre", 1, ROOM)
    await until(lambda: server.counters["claims"] == 1)
    server.deliver(PromptLogprobs(ROOM, tokens=[(-1.0, 5)] * 100))
    got = await asyncio.wait_for(claim.prompt_logprobs(), 5)
    assert got.tokens == [] and "over the room watch's 64" in got.error
    await claims.close()
    await server.close()
