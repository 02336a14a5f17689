"""What the engine process pushes to its worker (``--cpu-engine-process separate``): the new wire
messages, read-out snapshots sent only when they change, and KV event listener calls forwarded
in order from the engine thread to the service's loop."""

import asyncio
import threading

import pytest

from components.engine.api.totals import Totals
from components.engine.disagg.transport.prefill_writes import TransferTotals
from components.engine.process import wire
from components.engine.process.outbox import Outbox
from components.engine.process.publish import (PUSH_INTERVAL_S, KvForwarder, ReadoutPublisher,
                                                snapshot)


class FakeEngine:
    def __init__(self) -> None:
        self.in_use, self.totals, self.transfers = 0, Totals(), None

    def kv_pages_in_use(self): return self.in_use
    def kv_pages_cached(self): return 3
    def requests_in_flight(self): return 1 if self.in_use else 0
    def queue_depth(self): return 0
    def prefix_hit_tokens(self): return 16
    def request_totals(self): return self.totals
    def kv_transfer_totals(self): return self.transfers


def test_new_messages_round_trip():
    readouts = wire.Readouts(kv_pages_in_use=2, totals=(1, 2, 3, 4), transfers=(1, 4096, 0.5))
    assert wire.decode_to_worker(wire.encode(readouts)) == readouts
    events = wire.KvEvents(calls=[("blocks_stored", [[1, 2], [7], None]), ("load", [1, 1, 0])])
    decoded = wire.decode_to_worker(wire.encode(events))
    assert decoded.calls == [("blocks_stored", [[1, 2], [7], None]), ("load", [1, 1, 0])]
    assert wire.decode_to_engine(wire.encode(wire.Subscribe(kv_events=True))).kv_events


def test_snapshot_reads_every_readout():
    engine = FakeEngine()
    engine.in_use, engine.totals = 4, Totals(requests=2, prompt_tokens=10, generation_tokens=5,
                                             cached_tokens=3)
    engine.transfers = TransferTotals(writes=1, nbytes=64, seconds=0.25)
    s = snapshot(engine)
    assert (s.kv_pages_in_use, s.kv_pages_cached, s.requests_in_flight) == (4, 3, 1)
    assert s.totals == (2, 10, 5, 3) and s.transfers == (1, 64, 0.25)


async def test_readouts_are_sent_on_subscribe_and_then_only_when_they_change():
    engine, sent, busy = FakeEngine(), [], [False]
    publisher = ReadoutPublisher(engine, lambda peer, msg: sent.append((peer, msg)),
                                 lambda: busy[0])
    assert publisher.push() is False  # no subscriber: nothing computed or sent
    publisher.subscribe(b"w")
    assert len(sent) == 1 and sent[0][1].kv_pages_in_use == 0
    publisher.push()
    assert not publisher.push()  # unchanged: nothing more
    count = len(sent)
    engine.in_use = 5
    assert publisher.push() and sent[-1][1].kv_pages_in_use == 5 and len(sent) == count + 1


async def test_the_pusher_runs_while_busy_and_stops_once_idle_and_unchanged():
    engine, sent, busy = FakeEngine(), [], [True]
    publisher = ReadoutPublisher(engine, lambda peer, msg: sent.append(msg), lambda: busy[0])
    publisher.subscribe(b"w")
    pushes = []
    push = publisher.push
    publisher.push = lambda: pushes.append(1) or push()
    runner = asyncio.ensure_future(publisher.run())
    try:
        publisher.wake()
        engine.in_use = 2
        await asyncio.wait_for(_until(lambda: sent[-1].kv_pages_in_use == 2), 5)
        engine.in_use, busy[0] = 0, False
        await asyncio.wait_for(_until(lambda: sent[-1].kv_pages_in_use == 0), 5)
        count = len(pushes)
        # A window of 10 push intervals in which the idle pusher may compare at most once more
        # (the comparison that finds nothing changed): an observation, not a synchronization.
        await asyncio.sleep(10 * PUSH_INTERVAL_S)
        assert len(pushes) <= count + 1
        sent_before = len(sent)
        engine.in_use = 7  # changed while idle: nothing is sent until a request wakes it
        await asyncio.sleep(5 * PUSH_INTERVAL_S)
        assert len(sent) == sent_before
        publisher.wake()
        await asyncio.wait_for(_until(lambda: sent[-1].kv_pages_in_use == 7), 5)
    finally:
        runner.cancel()


async def test_kv_calls_cross_to_the_loop_in_order_in_batches():
    loop = asyncio.get_running_loop()
    batches: list[list] = []
    done = asyncio.Event()

    def flush(calls: list) -> None:
        batches.append(calls)
        if sum(len(b) for b in batches) == 300:
            done.set()

    forwarder = KvForwarder(loop, flush)

    def engine_thread() -> None:
        for i in range(100):
            forwarder.blocks_stored([i] * 16, [i], None if i == 0 else i - 1)
            forwarder.blocks_removed([i])
            forwarder.load(i, 1, 0)

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join(10)
    await asyncio.wait_for(done.wait(), 5)
    calls = [c for b in batches for c in b]
    assert [c[0] for c in calls[:3]] == ["blocks_stored", "blocks_removed", "load"]
    assert [c[1][1] for c in calls if c[0] == "blocks_stored"] == [[i] for i in range(100)]
    assert len(batches) < 300  # batched: fewer hops than calls


async def test_the_outbox_sends_a_peer_one_batch_per_loop_turn_in_order():
    class Sock:
        sent: list = []
        closed = False

        def send_multipart(self, parts):
            self.sent.append((parts[0], wire.decode_to_worker(parts[1])))

    sock = Sock()
    outbox = Outbox(asyncio.get_running_loop(), sock)
    for i in range(3):
        outbox.post(b"a", wire.Chunk(rid=f"r{i}", chunk={"i": i}))
    outbox.post(b"b", wire.Pages(in_use=1))
    assert sock.sent == []  # nothing until the turn ends
    await asyncio.sleep(0)  # one loop turn: the flush runs
    [(peer_a, batch), (peer_b, single)] = sock.sent
    assert peer_a == b"a" and [c.rid for c in batch.items] == ["r0", "r1", "r2"]
    assert peer_b == b"b" and single == wire.Pages(in_use=1)  # a lone message goes bare


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("name", ["blocks_stored", "blocks_removed", "load"])
def test_the_forwarder_is_a_kv_event_listener(name):
    assert callable(getattr(KvForwarder, name))
