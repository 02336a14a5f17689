"""Load on `--engine sglang`: KV blocks in use per DP rank, read from the load snapshots SGLang's
own schedulers write (SGLang's real shared-memory writer and reader here), published to
Dynamo's load publisher only when a rank's value changes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from components.backends.sglang import SglangBackend
from components.worker.metrics.load_relay import LoadRelay

load_snapshot = pytest.importorskip("sglang.srt.managers.load_snapshot")

PAGE = 16


class Publisher:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def publish(self, rank: int, kv_used_blocks: int) -> None:
        self.calls.append((rank, kv_used_blocks))


@pytest.fixture
def schedulers(tmp_path):
    """Two DP ranks' writers and an engine whose tokenizer manager reads them, as SGLang's."""
    path = str(tmp_path / "loads")
    writers = [load_snapshot.ShmLoadSnapshotWriter(path, dp_size=2, dp_rank=r) for r in (0, 1)]
    reader = load_snapshot.ShmLoadSnapshotReader(path, dp_size=2)
    engine = SimpleNamespace(tokenizer_manager=SimpleNamespace(load_snapshot_reader=reader))

    def write(rank: int, used_tokens: int) -> None:
        writers[rank].write(load_snapshot.LoadSnapshot(dp_rank=rank, num_used_tokens=used_tokens))

    yield engine, write
    reader.close()


def test_blocks_in_use_per_rank_round_up_to_whole_pages(schedulers):
    engine, write = schedulers
    write(0, 0)
    write(1, PAGE + 1)
    assert SglangBackend().kv_used_blocks(engine, PAGE) == {0: 0, 1: 2}


def test_a_rank_is_published_when_its_value_changes_only(schedulers):
    engine, write = schedulers
    publisher = Publisher()
    relay = LoadRelay(SglangBackend(), engine, PAGE, publisher)
    write(0, 3 * PAGE)
    write(1, 0)
    relay.step()
    relay.step()
    assert sorted(publisher.calls) == [(0, 3), (1, 0)]
    write(1, 2 * PAGE)
    relay.step()
    assert sorted(publisher.calls) == [(0, 3), (1, 0), (1, 2)]


async def test_the_relay_runs_on_the_loop_until_closed(schedulers):
    engine, write = schedulers
    write(0, PAGE)
    publisher = Publisher()
    relay = LoadRelay(SglangBackend(), engine, PAGE, publisher)
    relay.start()
    try:
        async with asyncio.timeout(5):
            while (0, 1) not in publisher.calls:
                await asyncio.sleep(0.01)
    finally:
        relay.close()
