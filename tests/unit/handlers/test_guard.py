"""RequestGuard's waits: `first_done` returns once one of the caller's futures is done and
never cancels them; a client stop or a failure ends the wait at once, a timeout after its
bound; the runtime's context future ending in an error is not a client stop."""

import asyncio

import pytest

from handlers.core.guard import RequestGuard, Stopped
from tests.support.handler_fakes import FakeContext, FakeEngine

pytestmark = pytest.mark.timeout(10)


def started(context=None) -> tuple[RequestGuard, FakeEngine]:
    engine = FakeEngine()
    guard = RequestGuard(engine, "rid-1", context)
    guard.start()
    guard.engine_started()
    return guard, engine


async def test_first_done_returns_when_a_future_is_done_and_leaves_the_others():
    guard, _ = started(FakeContext())
    loop = asyncio.get_running_loop()
    done, pending = loop.create_future(), loop.create_future()
    loop.call_soon(done.set_result, 1)
    await guard.first_done({done, pending}, timeout=5)
    assert done.result() == 1 and not pending.done()


async def test_first_done_raises_stopped_at_once_when_the_client_stops():
    context = FakeContext()
    guard, engine = started(context)
    pending = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(context.stop)
    with pytest.raises(Stopped):
        await guard.first_done({pending}, timeout=5)
    assert not pending.cancelled()  # the caller's to end
    assert engine.aborts == ["rid-1"]


async def test_first_done_raises_the_failure_and_times_out_without_cancelling():
    guard, engine = started()
    pending = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await guard.first_done({pending}, timeout=0.01)
    assert not pending.cancelled()
    asyncio.get_running_loop().call_soon(guard.fail, RuntimeError("prefill leg failed"))
    with pytest.raises(RuntimeError, match="prefill leg failed"):
        await guard.first_done({pending}, timeout=5)
    assert not pending.cancelled() and engine.aborts == ["rid-1"]


async def test_one_interrupt_serves_every_wait_of_the_request():
    context = FakeContext()
    guard, _ = started(context)
    loop = asyncio.get_running_loop()
    for i in range(3):  # earlier waits leave nothing behind that a later stop would miss
        assert await guard.race(asyncio.sleep(0, result=i), timeout=5) == i
    loop.call_soon(context.stop)
    with pytest.raises(Stopped):
        await guard.race(asyncio.sleep(5), timeout=10)


async def test_a_context_future_that_fails_is_not_a_client_stop():
    class EndingContext(FakeContext):
        def async_killed_or_stopped(self) -> asyncio.Future:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(RuntimeError("runtime shutting down"))
            return fut

    guard, engine = started(EndingContext())
    await asyncio.sleep(0)  # the callback runs
    assert not guard.stopped and engine.aborts == []
    guard.finish()
    guard.close()
