"""The prefill client adapter stops the prefill request whenever the decode side gives up:
cancelled while the prefill is still being reached, closed before reading, or stopped by the
client (fakes stand in for Dynamo's Client and Context)."""

import asyncio

import pytest
from dynamo.llm.exceptions import InvalidArgument

from components.runtime_adapter import RuntimePrefillClient
from handlers.errors import RequestError

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


async def test_a_request_the_prefill_engine_refused_is_the_clients_error():
    message = "min_new_tokens must be in [0, max_new_tokens(4)], got 9."
    client, parent = FakeClient([InvalidArgument(message)]), FakeContext()
    with pytest.raises(RequestError) as err:
        await RuntimePrefillClient(client).generate({}, parent)
    assert str(err.value) == message  # shown to the client as a 400, in SGLang's words
    assert client.contexts[0].stopped.is_set()
