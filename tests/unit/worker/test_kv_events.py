"""KV events for Dynamo's KV router: the prefix cache reports the blocks it starts and stops
holding (chained hashes, whole pages, parents), the engine reports its load, and the worker's
relay hands both to Dynamo's publishers with page size = block size."""

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from components.engine.process.engine import CpuEngine
from components.engine.kv.pool import KVPool
from components.engine.kv.prefix_cache import PrefixCache
from components.worker.metrics.kv_events import (EngineKvRelay, kv_events_enabled,
                                                 sglang_zmq_endpoints)
from tests.support.engine_helpers import random_prompt

PAGE = 4


class Recorder:
    """A KvEventListener that keeps what it was told, and the router's view it implies."""

    def __init__(self) -> None:
        self.stored: list[tuple[list[int], list[int], int | None]] = []
        self.removed: list[list[int]] = []
        self.loads: list[tuple[int, int, int]] = []
        self.held: set[int] = set()

    def blocks_stored(self, token_ids, block_hashes, parent_hash):
        assert len(token_ids) == PAGE * len(block_hashes)  # whole blocks only
        self.stored.append((list(token_ids), list(block_hashes), parent_hash))
        self.held.update(block_hashes)

    def blocks_removed(self, block_hashes):
        self.removed.append(list(block_hashes))
        self.held.difference_update(block_hashes)

    def load(self, kv_used_pages, running, waiting):
        self.loads.append((kv_used_pages, running, waiting))


def cache_with_recorder():
    pool = KVPool(1, 1, 2, num_pages=16, page_size=PAGE, dtype=torch.float32)
    cache = PrefixCache(pool)
    cache.listener = rec = Recorder()
    return pool, cache, rec


def finish(pool, cache, tokens):
    run = pool.allocate(len(tokens))
    tail = cache.insert(tokens, run)
    if tail is not None:
        pool.free(tail)


def test_insert_reports_only_new_whole_blocks_with_their_parent():
    pool, cache, rec = cache_with_recorder()
    finish(pool, cache, list(range(10)))  # 2 whole pages
    keys = cache.block_keys(list(range(10)), 2)
    assert rec.stored == [(list(range(8)), keys, None)]
    finish(pool, cache, list(range(8)))  # already held: nothing new
    assert len(rec.stored) == 1
    finish(pool, cache, list(range(12)) + [99])  # one more block, child of the second
    longer = cache.block_keys(list(range(12)), 3)
    assert longer[:2] == keys
    assert rec.stored[1] == ([8, 9, 10, 11], longer[2:], keys[1])
    assert rec.removed == []  # the first entry's blocks moved to the longer one, still cached


def test_eviction_reports_every_block_it_drops_and_the_router_view_matches_the_cache():
    pool, cache, rec = cache_with_recorder()
    finish(pool, cache, [1] * 8)
    finish(pool, cache, [2] * 12)
    assert cache.evict(cache.pages) == 5
    assert rec.held == set() and sorted(map(len, rec.removed)) == [2, 3]
    finish(pool, cache, [1] * 8)  # cached again after its eviction: reported again
    assert rec.stored[-1][1] == cache.block_keys([1] * 8, 2) and rec.held == set(rec.stored[-1][1])


async def test_engine_reports_cached_blocks_and_load_back_to_zero(tiny_model_path):
    rec = Recorder()
    eng = CpuEngine(model_path=tiny_model_path, page_size=PAGE)
    try:
        eng.set_kv_event_listener(rec)
        prompt = random_prompt(40, eng.vocab_size, seed=3)
        await asyncio.wait_for(eng.async_generate(
            input_ids=prompt, sampling_params={"temperature": 0.0, "max_new_tokens": 4}), 30)
        # 40 prompt + 3 output tokens have K/V: 10 whole pages, the prompt's first.
        assert len(rec.stored) == 1 and len(rec.stored[0][1]) == 10
        assert rec.stored[0][0][:40] == prompt and rec.stored[0][2] is None
        assert max(load[0] for load in rec.loads) >= 11 and rec.loads[-1] == (0, 0, 0)
        assert eng.prefix_hit_tokens() == 0
        await eng.async_generate(input_ids=prompt[:36] + [1, 2],
                                 sampling_params={"temperature": 0.0, "max_new_tokens": 1})
        assert eng.prefix_hit_tokens() == 36
    finally:
        eng.shutdown()


class FakePublisher:
    def __init__(self):
        self.calls = []

    def publish_stored(self, *args):
        self.calls.append(("stored", *args))

    def publish_removed(self, *args):
        self.calls.append(("removed", *args))

    def publish(self, *args, **kwargs):
        self.calls.append(("load", args, kwargs))


def test_relay_uses_the_page_size_as_block_size_and_reports_kv_used_blocks():
    events, metrics = FakePublisher(), FakePublisher()
    relay = EngineKvRelay(events, metrics, page_size=16)
    relay.blocks_stored(list(range(32)), [11, -12], 7)
    relay.blocks_removed([11])
    relay.load(5, 2, 1)
    relay.close()
    assert events.calls == [("stored", list(range(32)), [16, 16], [11, -12], 7),
                            ("removed", [11])]
    assert metrics.calls == [("load", (0,), {"kv_used_blocks": 5})]


@pytest.mark.parametrize("config, enabled", [
    (None, False), ('{"publisher": "null"}', False), ("{}", False),
    ('{"publisher": "zmq", "endpoint": "tcp://*:5557"}', True),
])
def test_kv_events_follow_sglangs_publisher_rule(config, enabled):
    assert kv_events_enabled(config) is enabled


def test_bad_kv_events_config_is_a_startup_error():
    with pytest.raises(SystemExit, match="JSON object"):
        kv_events_enabled("{not json")
    with pytest.raises(SystemExit, match="tcp://host:port"):
        sglang_zmq_endpoints('{"publisher": "zmq", "endpoint": "ipc:///tmp/x"}', range(1))
    with pytest.raises(SystemExit, match="no 'endpoint'"):
        sglang_zmq_endpoints('{"publisher": "zmq"}', range(1))


@pytest.mark.parametrize("endpoint, ranks, expected", [
    ("tcp://*:5557", range(1), [(0, "tcp://127.0.0.1:5557")]),
    # SGLang's scheduler of DP rank r binds port + r (ZmqEventPublisher.offset_endpoint_port).
    ("tcp://*:5557", range(3), [(0, "tcp://127.0.0.1:5557"), (1, "tcp://127.0.0.1:5558"),
                                (2, "tcp://127.0.0.1:5559")]),
    ("tcp://0.0.0.0:6000", range(2, 4), [(2, "tcp://127.0.0.1:6002"),
                                         (3, "tcp://127.0.0.1:6003")]),
    ("tcp://10.1.2.3:7000", range(2), [(0, "tcp://10.1.2.3:7000"), (1, "tcp://10.1.2.3:7001")]),
    ("tcp://[::1]:7000", range(2), [(0, "tcp://[::1]:7000"), (1, "tcp://[::1]:7001")]),
])
def test_each_dp_rank_is_relayed_from_the_port_sglang_offsets_it_to(endpoint, ranks, expected):
    config = json.dumps({"publisher": "zmq", "endpoint": endpoint})
    assert sglang_zmq_endpoints(config, ranks) == expected


def test_the_endpoints_agree_with_sglangs_own_offset_rule():
    offset = pytest.importorskip("sglang.srt.disaggregation.kv_events").ZmqEventPublisher \
        .offset_endpoint_port
    config = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"})
    assert sglang_zmq_endpoints(config, range(4)) == [
        (r, offset("tcp://127.0.0.1:5557", r)) for r in range(4)]


@pytest.mark.parametrize("args, ranks", [
    ({}, range(1)),
    ({"dp_size": 4}, range(4)),  # pure DP: every replica on this node
    ({"dp_size": 4, "nnodes": 2, "node_rank": 1}, range(4)),  # pure DP is single-node
    ({"dp_size": 4, "enable_dp_attention": True, "nnodes": 2, "node_rank": 1}, range(2, 4)),
    ({"dp_size": 1, "enable_dp_attention": True, "nnodes": 2}, range(1)),
])
def test_the_local_dp_ranks_follow_dynamo_1_6_1(args, ranks):
    from components.backends.sglang import local_dp_ranks

    assert local_dp_ranks(SimpleNamespace(**args)) == ranks


DECODE_CACHE = ("--disaggregation-decode-enable-radix-cache",)


@pytest.mark.parametrize("mode, orchestrator, extra, publishes", [
    ("null", "decode", (), True), ("prefill", "frontend", (), True),  # read by a KV router
    ("decode", "frontend", (), False), ("decode", "decode", (), False),  # no prefix cache
    ("decode", "decode", DECODE_CACHE, True),  # registers as an aggregated worker
    ("decode", "frontend", DECODE_CACHE, False),  # 1.6.1's decode router reads load only
    ("prefill", "decode", (), False),  # registers no model
    ("null", "decode", DECODE_CACHE, True),  # the flag is about decode engines only
])
def test_the_workers_a_kv_router_reads_publish_and_the_engine_never_sees_the_flag(
        monkeypatch, mode, orchestrator, extra, publishes):
    from components.backends import select as backend_select
    from components.worker.flags.config import parse_args
    from components.worker.serving import publishes_kv_events

    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    cfg = parse_args(["--engine", "cpu", "--model-path", "/models/tiny", "--disaggregation-mode",
                      mode, "--disagg-orchestrator", orchestrator, "--skip-tokenizer-init",
                      "--kv-events-config", '{"publisher": "zmq"}', *extra])
    assert publishes_kv_events(cfg) is publishes
    assert cfg.role.decode_cache is (mode == "decode" and bool(extra))
    assert cfg.engine_args.get("disaggregation_decode_enable_radix_cache", False) is bool(extra)
    assert "kv_events_config" not in cfg.engine_args


def test_a_failing_publisher_is_logged_and_publishing_goes_on(caplog):
    class Broken:
        def publish_stored(self, *args, **kwargs):
            raise Exception("event plane gone")

        publish_removed = publish = publish_stored

    relay = EngineKvRelay(Broken(), Broken(), page_size=16)
    relay.blocks_stored([1] * 16, [5], None)
    relay.blocks_removed([5])
    relay.load(1, 1, 0)
    relay.close()
    assert caplog.text.count("event plane gone") == 3


def test_an_sglang_config_without_endpoint_is_refused_at_parse_time(monkeypatch,
                                                                    tiny_model_path):
    """Before the model load (Dynamo 1.6.1 refuses it only after), on a role that relays; the
    CPU engine reports its events in-process and needs no endpoint."""
    from components.backends import select as backend_select
    from components.worker.flags.config import parse_args

    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    base = ["--model-path", tiny_model_path, "--kv-events-config"]
    with pytest.raises(SystemExit, match="--kv-events-config is set but has no 'endpoint'"):
        parse_args(["--engine", "sglang", *base, '{"publisher": "zmq"}'])
    ok = '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    assert parse_args(["--engine", "sglang", *base, ok]).kv_events_config == ok
    assert parse_args(["--engine", "cpu", *base, '{"publisher": "zmq"}']).kv_events_config
    decode = ["--disaggregation-mode", "decode"]  # relays nothing (role_publishes)
    assert parse_args(["--engine", "sglang", *decode, *base, '{"publisher": "zmq"}'])
    with pytest.raises(SystemExit, match="--kv-events-config is set but has no 'endpoint'"):
        parse_args(["--engine", "sglang", *decode, "--disaggregation-decode-enable-radix-cache",
                    *base, '{"publisher": "zmq"}'])  # relays its decode cache's events
