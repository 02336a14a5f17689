"""Stopping a worker, with fakes and real signals: live requests are ended when the drain time
runs out (mid-stream, and any that start later), the drain waits for the endpoint only as long
as its bound, a signal during startup cancels it (or raises while the engine is being built),
and the engine process learns at once that an attached process exited."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from components.worker.lifecycle import shutdown
from components.worker.lifecycle.shutdown import (
    StartupInterrupted, StopSignals, drain, interrupt_startup, settle,
)
from components.worker.lifecycle.tokenizer_workers import TokenizerWorkers
from handlers import DecodeHandler, PrefillHandler
from handlers.core.errors import EngineUnavailable
from handlers.core.live import LiveRequests, rid_prefix
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect, wait_until
from tests.unit.handlers.test_handlers_decode import AGG, REQUEST
from tests.unit.handlers.test_handlers_rooms import CONFIG as PREFILL_CONFIG
from tests.unit.handlers.test_frontend_disagg import FLAT

pytestmark = pytest.mark.timeout(20)

ENDED = EngineUnavailable("the worker is shutting down and its drain time (1 s) ran out")


async def test_rids_carry_this_process_prefix():
    engine = FakeEngine([chunk([10], {"type": "length", "length": 1})])
    handler = DecodeHandler(engine, AGG)
    for _ in range(2):
        await collect(handler.generate(REQUEST, FakeContext()))
    rids = [c["rid"] for c in engine.calls]
    assert all(r.startswith(rid_prefix(os.getpid())) for r in rids) and len(set(rids)) == 2
    assert len(handler.live) == 0


async def test_ending_live_requests_stops_a_stream_mid_way_with_the_error():
    engine = FakeEngine([chunk([10]), chunk([11])], hold=True)
    handler = DecodeHandler(engine, AGG)
    stream = handler.generate(REQUEST, FakeContext())
    assert (await anext(stream))["token_ids"] == [10]
    assert len(handler.live) == 1
    assert handler.live.end_all(ENDED) == 1
    with pytest.raises(EngineUnavailable, match="drain time"):
        await collect(stream)
    assert engine.aborts == [engine.calls[0]["rid"]] and len(handler.live) == 0


async def test_a_request_starting_after_the_end_is_ended_at_once():
    engine = FakeEngine([chunk([10])], hold=True)
    handler = DecodeHandler(engine, AGG)
    handler.live.end_all(ENDED)
    with pytest.raises(EngineUnavailable):
        await collect(handler.generate(REQUEST, FakeContext()))
    assert engine.calls == []  # it never reached the engine


async def test_ending_a_prefill_leg_aborts_its_engine_request():
    engine = FakeEngine(hold=True)
    handler = PrefillHandler(engine, PREFILL_CONFIG)
    stream = handler.generate(FLAT, FakeContext())
    await asyncio.wait_for(anext(stream), 5)  # the bootstrap item: the leg waits for its KV
    handler.live.end_all(ENDED)
    with pytest.raises(EngineUnavailable):
        await collect(stream)
    assert engine.aborts == [engine.calls[0]["rid"]]


class Request:
    def __init__(self, serving: asyncio.Future | None = None) -> None:
        self.ended: list[Exception] = []
        self._serving = serving

    def end(self, error: Exception) -> None:
        self.ended.append(error)
        if self._serving is not None:  # the endpoint drains once its requests end
            self._serving.set_result(None)


async def test_drain_returns_when_the_endpoint_is_idle_without_ending_anything():
    serving = asyncio.get_running_loop().create_future()
    live, request = LiveRequests(), Request()
    live.add(request)
    asyncio.get_running_loop().call_soon(serving.set_result, None)
    await asyncio.wait_for(drain(serving, live, timeout=5), 5)
    assert request.ended == []


async def test_drain_ends_live_requests_when_its_time_runs_out():
    serving = asyncio.get_running_loop().create_future()
    live, request = LiveRequests(), Request(serving)
    live.add(request)
    await asyncio.wait_for(drain(serving, live, timeout=0.05), 5)
    assert len(request.ended) == 1 and "drain time (0.05 s) ran out" in str(request.ended[0])
    assert not serving.cancelled()


async def test_drain_gives_up_on_an_endpoint_that_never_finishes(monkeypatch):
    monkeypatch.setattr(shutdown, "ENDED_WAIT_S", 0.05)
    serving = asyncio.get_running_loop().create_future()
    await asyncio.wait_for(drain(serving, LiveRequests(), timeout=0.05), 5)
    assert serving.cancelled()


async def test_a_prefill_engine_outlives_its_last_leg_by_the_settle_time():
    live, request = LiveRequests(), Request()
    await asyncio.wait_for(settle(live, 60), 1)  # nothing ever ended: no wait
    live.add(request)
    live.discard(request)
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(settle(live, 0.2), 5)
    assert asyncio.get_running_loop().time() - started >= 0.15


async def test_a_signal_during_startup_cancels_it_and_once_serving_stops_the_worker():
    startup = asyncio.ensure_future(asyncio.Event().wait())
    signals = StopSignals(startup, workers=None)
    signals()
    with pytest.raises(asyncio.CancelledError):
        await startup
    assert signals.interrupted

    class Worker:
        calls: list[str] = []

        def orphan(self, reason: str) -> None:
            self.calls.append(reason)

        async def stop(self) -> None:
            self.calls.append("stop")

    serving = StopSignals(asyncio.ensure_future(asyncio.sleep(0)), workers=None)
    serving.worker = Worker()
    serving()
    serving()  # a second signal starts no second stop
    await wait_until(lambda: Worker.calls == ["stop"])
    assert not serving.interrupted
    # SGLang's watchdog reports a subprocess that the group signal stopped with a SIGQUIT: once
    # stopping, that ends the engine's requests instead of SGLang's handler killing the process.
    try:
        os.kill(os.getpid(), signal.SIGQUIT)
        await wait_until(lambda: Worker.calls == ["stop", shutdown.ENGINE_EXIT_WHILE_STOPPING])
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGQUIT)


async def test_an_engine_process_that_exits_ends_the_attached_requests_then_stops():
    calls: list[str] = []

    class Worker:
        def orphan(self) -> None:
            calls.append("orphan")

        async def stop(self) -> None:
            calls.append("stop")

    signals = StopSignals(asyncio.ensure_future(asyncio.sleep(0)), workers=None)
    signals.worker = Worker()
    signals.engine_exited()
    await wait_until(lambda: calls == ["orphan", "stop"])


def test_a_signal_while_the_engine_is_built_raises_startup_interrupted():
    before = {sig: signal.getsignal(sig) for sig in shutdown.STOP_SIGNALS}
    try:
        interrupt_startup()
        with pytest.raises(StartupInterrupted, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # the handler runs at the next bytecode boundary
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


async def test_the_engine_process_learns_at_once_that_an_attached_process_exited():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited: list[int] = []
    try:
        TokenizerWorkers([proc]).watch(asyncio.get_running_loop(), exited.append)
        proc.kill()
        await wait_until(lambda: exited == [proc.pid], timeout=10)
    finally:
        proc.kill()
        proc.wait(10)
