"""SGLang's aborts ordered after dispatch (components/backends/sglang_aborts.py), against a stand-in with
the TokenizerManager's fields: an abort of a rid not dispatched yet waits for its dispatch, so
the scheduler sees the request before its abort; other aborts pass straight through."""

import asyncio
from types import SimpleNamespace

import pytest

from components.backends.sglang_aborts import aborts_are_ordered, order_aborts

pytestmark = pytest.mark.timeout(10)


class StandIn:
    def __init__(self) -> None:
        self.rid_to_state: dict = {}
        self.sent: list[str] = []

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        state = self.rid_to_state.get(rid)
        if state is not None:
            state.abort_sent = True
        self.sent.append(rid)


async def test_an_abort_before_dispatch_is_sent_once_the_request_is_dispatched():
    tm = StandIn()
    order_aborts(tm)
    assert aborts_are_ordered(tm)
    state = tm.rid_to_state["r1"] = SimpleNamespace(dispatched=False, abort_sent=False)
    tm.abort_request("r1")
    tm.abort_request("r1")  # a second abort while waiting adds nothing
    await asyncio.sleep(0.05)
    assert tm.sent == [] and not state.abort_sent
    state.dispatched = True
    for _ in range(100):
        if tm.sent:
            break
        await asyncio.sleep(0.01)
    assert tm.sent == ["r1"]


async def test_dispatched_and_unknown_rids_are_aborted_at_once():
    tm = StandIn()
    order_aborts(tm)
    tm.rid_to_state["r2"] = SimpleNamespace(dispatched=True, abort_sent=False)
    tm.abort_request("r2")
    tm.abort_request("unknown")
    assert tm.sent == ["r2", "unknown"]


async def test_a_request_that_ends_before_dispatch_is_not_aborted():
    tm = StandIn()
    order_aborts(tm)
    tm.rid_to_state["r3"] = SimpleNamespace(dispatched=False, abort_sent=False)
    tm.abort_request("r3")
    del tm.rid_to_state["r3"]  # SGLang dropped the undelivered state itself
    await asyncio.sleep(0.05)
    assert tm.sent == []
