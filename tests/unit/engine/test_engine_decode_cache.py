"""A decode engine with a prefix cache (`--disaggregation-decode-enable-radix-cache`): a
conversation's next turn copies what the decode kept of the last one, the prefill WRITEs only the
rest (`tests/unit/transport/test_partial_writes.py` counts the bytes), and the output is the
aggregated engine's, with the cache hit, after an eviction, and after an abort.

The prefill in a child process, the decode and the aggregated reference here, real NIXL between.
"""

import asyncio

import pytest

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import boot, drain, random_prompt, wait_until
from tests.unit.engine.disagg_engines import TIMEOUTS, assert_pools_empty, pair

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

PAGE = 16
POOL_TOKENS = 64 * PAGE  # small, so that a few long prompts evict the cache
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def decode(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, disaggregation_mode="decode",
                    disaggregation_decode_enable_radix_cache=True, page_size=PAGE,
                    max_total_tokens=POOL_TOKENS, **TIMEOUTS)
    yield eng
    eng.shutdown()


async def two_turns(prefill, decode, agg, seed):
    """Turn 1, then turn 2 (its history plus a new message) -> turn 2's tokens from the pair,
    the aggregated engine's for the same prompt, and the decode's cache hit on turn 2."""
    history = random_prompt(100, agg.vocab_size, seed=seed)
    _, first = await pair(prefill, decode, history, GREEDY)
    history += first["output_ids"] + random_prompt(20, agg.vocab_size, seed=seed + 1)
    hits = decode.prefix_hit_tokens()
    _, second = await pair(prefill, decode, history, GREEDY)
    want = await agg.async_generate(input_ids=history, sampling_params=GREEDY)
    return second["output_ids"], want["output_ids"], decode.prefix_hit_tokens() - hits


async def test_the_next_turn_reuses_the_decodes_kv_and_equals_aggregated(prefill, decode, agg):
    got, want, hit = await two_turns(prefill, decode, agg, seed=71)
    assert got == want
    # Turn 1 left its prompt and all outputs but the last in the pool: 100 + 11 tokens, 6 pages.
    assert hit == 6 * PAGE
    await assert_pools_empty(prefill, decode)


async def test_an_evicted_history_is_sent_whole_and_still_equals_aggregated(prefill, decode, agg):
    history = random_prompt(100, agg.vocab_size, seed=81)
    _, first = await pair(prefill, decode, history, GREEDY)
    for seed in range(3):  # unrelated prompts that need the cached pages
        await pair(prefill, decode, random_prompt(POOL_TOKENS // 2, agg.vocab_size, seed), GREEDY)
    history += first["output_ids"] + [5, 6, 7]
    hits = decode.prefix_hit_tokens()
    _, second = await pair(prefill, decode, history, GREEDY)
    want = await agg.async_generate(input_ids=history, sampling_params=GREEDY)
    assert decode.prefix_hit_tokens() == hits and second["output_ids"] == want["output_ids"]
    await assert_pools_empty(prefill, decode)


async def test_an_aborted_turn_leaves_nothing_cached(prefill, decode, agg):
    history = random_prompt(100, agg.vocab_size, seed=91)
    b = boot(prefill)
    stream = await decode.async_generate(input_ids=history, sampling_params=GREEDY, stream=True,
                                         rid="aborted-turn", **b)
    reading = asyncio.create_task(drain(stream))  # a stream is sent on its first read
    await wait_until(lambda: decode.kv_pages_in_use() > 0, what="decode registered the room")
    decode.tokenizer_manager.abort_request("aborted-turn")  # its KV never comes
    chunks = await asyncio.wait_for(reading, 5)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    p = await asyncio.wait_for(prefill.final(input_ids=history, sampling_params=GREEDY, **b), 10)
    assert p["meta_info"]["finish_reason"]["type"] == "abort"
    hits = decode.prefix_hit_tokens()
    _, again = await pair(prefill, decode, history + [5], GREEDY)
    want = await agg.async_generate(input_ids=history + [5], sampling_params=GREEDY)
    assert decode.prefix_hit_tokens() == hits and again["output_ids"] == want["output_ids"]
    await assert_pools_empty(prefill, decode)
