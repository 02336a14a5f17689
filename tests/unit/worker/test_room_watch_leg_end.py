"""The prefill leg's end over the room watch, real loopback TCP (n > 1 frontend-orchestrated;
handlers/disagg/leg_end.py): `leg_ended` reaches the claim of the room's decode half only, next
to its prompt logprobs without mixing them up, also when it comes before the claim; a connection that closes first says no word will
come (False) instead of leaving the decode's finish waiting."""

from __future__ import annotations

import asyncio

import pytest

from protocol.room_watch import LegEnded, PromptLogprobs, decode_to_decode, frame
from tests.unit.worker.test_room_watch import ROOM, claims_for, until, watch_server

pytestmark = pytest.mark.timeout(10)


def test_the_frame_round_trips_next_to_prompt_logprobs():
    assert decode_to_decode(frame(LegEnded(ROOM))[4:]) == LegEnded(ROOM)
    assert decode_to_decode(frame(PromptLogprobs(ROOM))[4:]) == PromptLogprobs(ROOM)


async def test_a_claimed_room_hears_its_leg_end_and_only_its_own():
    server = await watch_server()
    claims = claims_for(server)
    mine, other = (await claims.claim("pre", 1, ROOM), await claims.claim("pre", 1, ROOM + 1))
    await until(lambda: server.counters["claims"] == 2)
    server.leg_ended(ROOM)
    assert await asyncio.wait_for(mine.leg_ended(), 5) is True
    assert not mine.prompt_logprobs().done()  # a leg end is not prompt logprobs
    assert not other.leg_ended().done()
    server.leg_ended(ROOM + 99)  # nobody claimed it: nothing to tell, nothing breaks
    await claims.close()
    await server.close()


async def test_a_leg_end_sent_before_the_claim_waits_for_it():
    server = await watch_server()
    claims = claims_for(server)
    server.leg_ended(ROOM)  # an n > 1 leg ends before the frontend sends the decode its half
    claim = await claims.claim("pre", 1, ROOM)
    assert await asyncio.wait_for(claim.leg_ended(), 5) is True
    await claims.close()
    await server.close()


async def test_a_closed_connection_ends_the_wait_with_false():
    server = await watch_server()
    claims = claims_for(server)
    claim = await claims.claim("pre", 1, ROOM)
    await until(lambda: server.counters["claims"] == 1)
    await server.close()
    await claims.close()
    assert await asyncio.wait_for(claim.leg_ended(), 5) is False
