"""The prefix cache: finished requests' whole KV pages serve later prompts that start with the
same tokens, outputs are token-identical with and without it, and cached pages always yield to
requests when the pool is short."""

import asyncio

import pytest
import torch

from components.engine.process.engine import CpuEngine
from components.engine.api.totals import Totals
from components.engine.kv.pool import KVPool
from components.engine.kv.prefix_cache import PrefixCache
from tests.support.engine_helpers import random_prompt

PAGE = 4
GREEDY = {"temperature": 0.0, "max_new_tokens": 12}


def make_cache():
    pool = KVPool(1, 1, 2, num_pages=32, page_size=PAGE, dtype=torch.float32)
    return pool, PrefixCache(pool)


def finished(pool, cache, tokens):
    """A request whose KV (value = its token id) is in the pool finishes into the cache."""
    run = pool.allocate(len(tokens))
    start = run.start_page * PAGE
    pool.tensor[:, :, :, start:start + len(tokens)] = torch.tensor(tokens, dtype=torch.float32
                                                                    ).view(1, 1, 1, -1, 1)
    tail = cache.insert(tokens, run)
    if tail is not None:
        pool.free(tail)


def test_reuse_copies_the_longest_cached_whole_page_prefix():
    pool, cache = make_cache()
    finished(pool, cache, list(range(10, 21)))  # 11 tokens: 2 whole pages kept, 1 page freed
    assert cache.pages == 2 and pool.pages_in_use == 2
    dst = pool.allocate(16)
    start = dst.start_page * PAGE
    n = cache.reuse(list(range(10, 18)) + [99, 98], start)
    assert n == 8
    assert pool.tensor[0, 0, 0, start:start + 8, 0].tolist() == list(range(10, 18))
    assert cache.reuse([10, 11, 12, 13], start) == 0  # at least one token is left to compute
    assert cache.reuse([10, 11, 12, 77, 5, 6], start) == 0  # first page differs


def test_a_longer_entry_replaces_the_one_it_covers_and_duplicates_are_not_kept():
    pool, cache = make_cache()
    finished(pool, cache, list(range(8)))
    finished(pool, cache, list(range(8)))  # same blocks again: no second copy
    assert cache.pages == 2
    finished(pool, cache, list(range(12)))  # covers the first entry's blocks: it is dropped
    assert cache.pages == 3 and pool.pages_in_use == 3


def test_eviction_frees_least_recently_used_first():
    pool, cache = make_cache()
    finished(pool, cache, [1] * 8)
    finished(pool, cache, [2] * 8)
    cache.reuse([1] * 8 + [0], pool.allocate(12).start_page * PAGE)  # [1]s are now recent
    assert cache.evict(1) == 2
    assert cache.reuse([2] * 8 + [0], 0) == 0 and cache.reuse([1] * 8 + [0], 0) == 8


@pytest.fixture(scope="module")
def engines(small_model_path):
    cached = CpuEngine(model_path=small_model_path)
    plain = CpuEngine(model_path=small_model_path, disable_radix_cache=True)
    yield cached, plain
    cached.shutdown()
    plain.shutdown()


async def test_repeated_prefix_is_reused_and_outputs_are_identical(engines):
    cached, plain = engines
    system = random_prompt(300, cached.vocab_size, seed=11)
    prompts = [system + random_prompt(20, cached.vocab_size, seed=20 + i) for i in range(4)]
    first = await cached.async_generate(input_ids=prompts[0], sampling_params=GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    rest = await asyncio.gather(*(cached.async_generate(input_ids=p, sampling_params=GREEDY)
                                  for p in prompts[1:]))
    assert all(r["meta_info"]["cached_tokens"] >= 288 for r in rest)  # 18 whole 16-token pages
    want = [await plain.async_generate(input_ids=p, sampling_params=GREEDY) for p in prompts]
    assert [o["output_ids"] for o in [first, *rest]] == [w["output_ids"] for w in want]
    assert cached.kv_pages_in_use() == 0 and cached.kv_pages_cached() > 0


async def test_cached_pages_yield_to_new_requests(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, max_total_tokens=512)
    try:
        for seed in range(6):  # each leaves ~200 tokens cached; the pool holds 512
            out = await asyncio.wait_for(eng.async_generate(
                input_ids=random_prompt(200, eng.vocab_size, seed), sampling_params=GREEDY), 30)
            assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert eng.kv_pages_in_use() == 0 and 0 < eng.kv_pages_cached() <= 512 // 16
    finally:
        eng.shutdown()


async def test_chunked_prefill_resumes_after_the_cached_prefix_token_exact(tiny_model_path):
    chunked = CpuEngine(model_path=tiny_model_path, chunked_prefill_size=64)
    plain = CpuEngine(model_path=tiny_model_path, disable_radix_cache=True)
    try:
        system = random_prompt(200, chunked.vocab_size, seed=5)
        prompts = [system + random_prompt(70, chunked.vocab_size, seed=50 + i) for i in range(2)]
        outs = [await chunked.async_generate(input_ids=p, sampling_params=GREEDY) for p in prompts]
        assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 192]  # 12 whole pages
        # The totals the worker's sglang:* counters and hit rate read.
        assert chunked.request_totals() == Totals(requests=2, prompt_tokens=540,
                                                  generation_tokens=24, cached_tokens=192)
        want = [await plain.async_generate(input_ids=p, sampling_params=GREEDY) for p in prompts]
        assert [o["output_ids"] for o in outs] == [w["output_ids"] for w in want]
    finally:
        chunked.shutdown()
        plain.shutdown()


async def test_an_aborted_request_leaves_nothing_in_the_cache(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path)
    try:
        prompt = random_prompt(100, eng.vocab_size, seed=9)
        params = {"temperature": 0.0, "max_new_tokens": 4000, "ignore_eos": True}
        stream = await eng.async_generate(input_ids=prompt, sampling_params=params, stream=True,
                                          rid="gone")
        async for _chunk in stream:
            eng.tokenizer_manager.abort_request("gone")
        assert eng.kv_pages_in_use() == 0 and eng.kv_pages_cached() == 0
        out = await eng.async_generate(input_ids=prompt, sampling_params=GREEDY)
        assert out["meta_info"]["cached_tokens"] == 0
    finally:
        eng.shutdown()


def test_eviction_goes_on_until_a_contiguous_run_fits():
    """LRU order need not be address order: the first round frees pages that are not adjacent,
    and a request needs one run. (One round only left the queue stalled with an idle engine.)"""
    pool = KVPool(1, 1, 2, num_pages=12, page_size=PAGE, dtype=torch.float32)
    cache = PrefixCache(pool)
    for k in range(4):  # four 3-page entries at pages 0-2, 3-5, 6-8, 9-11: the pool is full
        finished(pool, cache, [k + 1] * 12)
    for k in (0, 2):  # entries 0 and 2 are used again: LRU order is 1, 3, 0, 2
        cache.reuse([k + 1] * 12 + [0], 0)
    assert pool.allocate(PAGE) is None
    run = cache.allocate(5 * PAGE)  # evicting 1 and 3 frees 6 pages, but in two runs of 3
    assert run is not None and run.num_pages == 5
    assert pool.pages_in_use == 5 + cache.pages
