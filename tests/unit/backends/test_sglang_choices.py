"""n > 1 on a disaggregated sglang.Engine (components/backends/sglang_choices.py), on a fake
engine: one n = 1 request per choice in rooms room, room + 1, ...; the prefill warms its radix
cache first through the fake bootstrap host; chunks tagged by choice; closing aborts all."""

import asyncio

import pytest

from components.backends.sglang_choices import RoomPerChoice
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, choice_room
from protocol.limits import MAX_BOOTSTRAP_ROOM

BOOT = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 9000, "bootstrap_room": 77}


class FakeSglang:
    """Records each call; each stream yields `tokens` chunks (or blocks after one if `hold`)."""

    def __init__(self, tokens: int = 2, hold: bool = False) -> None:
        self.calls: list[dict] = []
        self.events: list[str] = []
        self.closed: list[str] = []
        self.tokens, self.hold = tokens, hold
        self.server_args = object()

    async def async_generate(self, **kw):
        self.calls.append(kw)
        return self._stream(kw)

    async def _stream(self, kw):
        name = f"{kw['bootstrap_host']}:{kw['bootstrap_room']}"
        self.events.append(f"start {name}")
        try:
            for t in range(self.tokens):
                yield {"output_ids": [t], "meta_info": {"id": kw["rid"]}}
                if self.hold:
                    await asyncio.Event().wait()
            self.events.append(f"end {name}")
        finally:
            self.closed.append(name)


def request(n: int, **extra) -> dict:
    return {"input_ids": [1, 2, 3], "sampling_params": {"n": n, "max_new_tokens": 2},
            "stream": True, "rid": "r", **BOOT, **extra}


async def collect(stream) -> list[dict]:
    return [c async for c in stream]


@pytest.mark.asyncio
async def test_decode_runs_one_request_per_choice_in_consecutive_rooms():
    fake = FakeSglang()
    chunks = await collect(await RoomPerChoice(fake, prefill=False).async_generate(**request(3)))
    assert [c["bootstrap_room"] for c in fake.calls] == [77, 78, 79]
    assert [c["rid"] for c in fake.calls] == ["r-0", "r-1", "r-2"]
    assert all(c["sampling_params"] == {"n": 1, "max_new_tokens": 2} for c in fake.calls)
    assert sorted((c["index"], c["meta_info"]["id"]) for c in chunks) == [
        (i, f"r-{i}") for i in range(3) for _ in range(2)]


@pytest.mark.asyncio
async def test_prefill_caches_the_prompt_through_the_fake_host_before_the_choices():
    fake = FakeSglang()
    await collect(await RoomPerChoice(fake, prefill=True).async_generate(**request(2)))
    warm = fake.calls[0]
    assert (warm["bootstrap_host"], warm["rid"]) == (FAKE_BOOTSTRAP_HOST, "r-warm")
    assert warm["sampling_params"]["max_new_tokens"] == 1
    # the warm-up ended before any choice was started: its KV is in the radix cache by then
    assert fake.events.index(f"end {FAKE_BOOTSTRAP_HOST}:0") < fake.events.index("start 10.0.0.7:77")
    assert [c["bootstrap_room"] for c in fake.calls[1:]] == [77, 78]


@pytest.mark.asyncio
@pytest.mark.parametrize("extra", [{"sampling_params": {"n": 1}}, {"bootstrap_room": None},
                                   {"bootstrap_host": FAKE_BOOTSTRAP_HOST}])
async def test_one_choice_or_no_room_goes_to_sglang_as_is(extra):
    fake = FakeSglang()
    req = request(3, **extra)
    await collect(await RoomPerChoice(fake, prefill=True).async_generate(**req))
    assert fake.calls == [req]


@pytest.mark.asyncio
async def test_closing_the_stream_closes_every_choice():
    fake = FakeSglang(hold=True)
    stream = await RoomPerChoice(fake, prefill=False).async_generate(**request(3))
    seen = {(await anext(stream))["index"] for _ in range(3)}
    assert seen == {0, 1, 2}
    await stream.aclose()
    assert sorted(fake.closed) == ["10.0.0.7:77", "10.0.0.7:78", "10.0.0.7:79"]


def test_choice_rooms_wrap_within_the_room_range():
    assert [choice_room(5, i) for i in range(3)] == [5, 6, 7]
    assert choice_room(MAX_BOOTSTRAP_ROOM, 1) == 1
