"""The prefill client adapter stops the prefill request whenever the decode side gives up:
cancelled while the prefill is still being reached, closed before reading, or stopped by the
client; retries a refusing instance after a bounded backoff; turns what the prefill rejected
into the client's error (fakes stand in for Dynamo's Client and Context; the exception types
are Dynamo's own)."""

import asyncio

import pytest
from dynamo.llm.exceptions import InvalidArgument

from components.worker.lifecycle.backoff import Backoff
from components.worker.lifecycle.runtime import RuntimePrefillClient
from handlers.core.errors import PrefillUnavailable, RequestError

pytestmark = pytest.mark.timeout(10)


class FakeContext:
    def __init__(self, name: str = "req") -> None:
        self.name = name
        self.stopped = asyncio.Event()
        self.children: list["FakeContext"] = []

    def id(self) -> str:
        return self.name

    def detached(self, name: str) -> "FakeContext":
        child = FakeContext(name)
        self.children.append(child)
        return child

    def stop_generating(self) -> None:
        self.stopped.set()

    async def async_killed_or_stopped(self) -> bool:
        await self.stopped.wait()
        return True


class FakeClient:
    """One prefill instance whose stream yields `items`, the first after `first_delay` s."""

    def __init__(self, items, first_delay: float = 0.0) -> None:
        self.items = items
        self.first_delay = first_delay
        self.contexts: list[FakeContext] = []

    def instance_ids(self):
        return [1]

    async def direct(self, request, instance_id, annotated=False, context=None):
        self.contexts.append(context)

        async def stream():
            await asyncio.sleep(self.first_delay)
            for item in self.items:
                if isinstance(item, Exception):
                    raise item
                yield item

        return stream()


BOOT = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 7}


async def test_cancelled_while_waiting_for_the_first_item_stops_the_prefill():
    client, parent = FakeClient([BOOT], first_delay=5.0), FakeContext()
    call = asyncio.ensure_future(RuntimePrefillClient(client).generate({}, parent))
    while not client.contexts:  # the request has left for the prefill worker
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert client.contexts[0].stopped.is_set()


async def test_closing_an_unread_stream_stops_the_prefill():
    client, parent = FakeClient([BOOT, {"finished": True}]), FakeContext()
    stream = await RuntimePrefillClient(client).generate({}, parent)
    await stream.aclose()
    assert client.contexts[0].stopped.is_set()
    assert [item async for item in stream] == []


async def test_client_stop_reaches_the_prefill_before_its_stream_is_read():
    client, parent = FakeClient([BOOT]), FakeContext()
    await RuntimePrefillClient(client).generate({}, parent)
    parent.stop_generating()
    await asyncio.wait_for(client.contexts[0].stopped.wait(), 5)


async def test_a_stream_read_to_its_end_leaves_the_prefill_alone():
    client, parent = FakeClient([BOOT, {"finished": True}]), FakeContext()
    stream = await RuntimePrefillClient(client).generate({}, parent)
    assert [item async for item in stream] == [BOOT, {"finished": True}]
    await stream.aclose()
    assert not client.contexts[0].stopped.is_set()


# --- refused instances: bounded backoff, then retried ----------------------------------------

REFUSED = "Unavailable: TCP connection to 127.0.0.1:1 failed"


class FlakyClient:
    """Instances `ids`; `refuse` says which instance ids refuse the next connection."""

    def __init__(self, ids, refuse=()) -> None:
        self.ids = list(ids)
        self.refuse = set(refuse)
        self.tried: list[int] = []

    def instance_ids(self):
        return list(self.ids)

    async def direct(self, request, instance_id, annotated=False, context=None):
        self.tried.append(instance_id)
        if instance_id in self.refuse:
            raise Exception(REFUSED)

        async def stream():
            yield BOOT

        return stream()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def new_backoff(clock) -> Backoff:
    return Backoff(first_s=1.0, max_s=4.0, clock=clock)


def adapter(client, clock, backoff: Backoff | None = None) -> RuntimePrefillClient:
    # A test that checks the refused-instance table passes its own Backoff and reads that.
    return RuntimePrefillClient(client, connect_timeout=0.05,
                                backoff=new_backoff(clock) if backoff is None else backoff)


async def test_a_refused_instance_is_retried_after_its_backoff():
    client, clock = FlakyClient([7], refuse={7}), Clock()
    refused = new_backoff(clock)
    prefill = adapter(client, clock, refused)
    with pytest.raises(PrefillUnavailable, match="did not respond within"):
        await prefill.generate({}, None)
    client.refuse.clear()  # the listener is up now
    assert prefill.live_instances() == []  # still backing off
    clock.now += 1.0
    stream = await prefill.generate({}, None)
    assert [item async for item in stream] == [BOOT]
    assert client.tried[-1] == 7 and len(refused) == 0  # success clears it


async def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(first_s=1.0, max_s=4.0, clock=Clock())
    assert [backoff.failed(1) for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]


async def test_a_new_instance_id_is_tried_at_once_and_the_old_entry_forgotten():
    client, clock = FlakyClient([7], refuse={7}), Clock()
    refused = new_backoff(clock)
    prefill = adapter(client, clock, refused)
    with pytest.raises(PrefillUnavailable):
        await prefill.generate({}, None)
    client.ids = [8]  # the prefill restarted under a new id
    stream = await prefill.generate({}, None)
    assert [item async for item in stream] == [BOOT] and client.tried[-1] == 8
    assert len(refused) == 0


# --- what the prefill rejects is the client's error, as in aggregated mode --------------------

class RejectingClient(FlakyClient):
    def __init__(self, exc, after_first: bool) -> None:
        super().__init__([1])
        self.exc, self.after_first = exc, after_first

    async def direct(self, request, instance_id, annotated=False, context=None):
        async def stream():
            if self.after_first:
                yield BOOT
            raise self.exc

        return stream()


@pytest.mark.parametrize("after_first", [False, True])
@pytest.mark.parametrize("exc, message", [
    (InvalidArgument("The input (9000 tokens) is longer than the model's context"),
     "The input (9000 tokens) is longer than the model's context"),
    (ValueError("InvalidRequest: ValueError: top_k must be -1"), "top_k must be -1"),
])
async def test_a_prefill_rejection_becomes_a_request_error(exc, message, after_first):
    prefill = adapter(RejectingClient(exc, after_first), Clock())
    with pytest.raises(RequestError) as info:
        stream = await prefill.generate({}, None)
        _ = [item async for item in stream]
    assert str(info.value) == message


async def test_a_prefill_that_never_answers_is_unavailable():
    exc = Exception("DeadlineExceeded: TCP request to 127.0.0.1:1 timed out")
    prefill = adapter(RejectingClient(exc, False), Clock())
    with pytest.raises(PrefillUnavailable, match=r"did not respond within \d+ s"):
        await prefill.generate({}, None)


async def test_other_prefill_failures_stay_what_they_are():
    prefill = adapter(RejectingClient(RuntimeError("engine died"), True), Clock())
    stream = await prefill.generate({}, None)
    with pytest.raises(RuntimeError, match="engine died"):
        _ = [item async for item in stream]


async def test_a_request_the_prefill_engine_refused_is_the_clients_error():
    message = "min_new_tokens must be in [0, max_new_tokens(4)], got 9."
    client, parent = FakeClient([InvalidArgument(message)]), FakeContext()
    with pytest.raises(RequestError) as err:
        await RuntimePrefillClient(client).generate({}, parent)
    assert str(err.value) == message  # shown to the client as a 400, in SGLang's words
    assert client.contexts[0].stopped.is_set()
