"""Dynamo's KV router picking the prefill worker: `dynamo.frontend --router-mode kv`, two prefill
workers publishing KV events and one decode worker, frontend-orchestrated (Dynamo 1.6.1's style:
the frontend's prefill router reads the prefill workers' events), on the CPU engine and on
`sglang.Engine` (SGLang's CPU path, its scheduler's ZMQ events relayed).

A request that repeats a long prefix goes to the prefill worker that computed it: only that
worker's `generate` request count grows (Dynamo's counter), and the repeat is served from its
cache: the response's `usage.prompt_tokens_details.cached_tokens` is the prefix (the decode
reports its prefill's cached tokens, as SGLang's does, and the frontend passes them on), and on
the CPU engine that prefill's `/engine/prefix_cache` hit counter grows by the prefix."""

from __future__ import annotations

import random

import pytest

from harness.kv_routing import (
    PREFILLS, prefill_requests, prefix_cache_stats, start_kv_routed_disagg,
)
from tests.e2e.client import completion
from tests.support.topologies import ENGINE_ARGS, SGLANG_ENGINE_ARGS

# Three SGLang engines start together here (128-166 s on a shared, busy 2-core box); the CPU
# engine's stack in 30-40 s.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

SERVED = "tiny-kv-disagg"
PREFIX_TOKENS = 480  # 30 pages of 16 (ENGINE_ARGS); SGLang on CPU pages by 1
REPEATS = 3


@pytest.fixture(scope="module", params=["cpu", "sglang"])
def kv_stack(tmp_path_factory, tiny_model_path, request):
    args = ENGINE_ARGS if request.param == "cpu" else SGLANG_ENGINE_ARGS
    stack = start_kv_routed_disagg(tmp_path_factory.mktemp(f"kv-disagg-{request.param}"),
                                   tiny_model_path, SERVED, "kv", args, engine=request.param)
    stack.engine = request.param
    yield stack
    stack.stop()


def send(http, stack, ids) -> dict:
    # ignore_eos: sampled at temperature 1, the model may end at its first token
    out = completion(http, stack.url, {"model": SERVED, "prompt": ids, "max_tokens": 2,
                                       "ignore_eos": True})
    assert out["usage"]["completion_tokens"] == 2
    return out["usage"]


def cached_tokens(usage: dict) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_a_repeated_prefix_goes_to_the_prefill_worker_that_caches_it(kv_stack, http):
    rng = random.Random(11)
    for _ in range(2):  # two unrelated prefixes, each wherever the router first puts it
        prefix = [rng.randrange(100, 2000) for _ in range(PREFIX_TOKENS)]
        before = prefill_requests(kv_stack)
        assert cached_tokens(send(http, kv_stack, prefix + [1])) == 0  # a new prefix
        after = prefill_requests(kv_stack)
        holders = [p for p in PREFILLS if after[p] > before[p]]
        assert len(holders) == 1, (before, after)
        holder = holders[0]
        hits_before = prefix_cache_stats(kv_stack)
        usages = [send(http, kv_stack, prefix + [2 + i, 3 + i]) for i in range(REPEATS)]
        final = prefill_requests(kv_stack)
        for p in PREFILLS:
            assert final[p] - after[p] == (REPEATS if p == holder else 0), (p, holder, final)
        # The whole prefix (the extra tokens differ each time) came from the holder's cache.
        assert [cached_tokens(u) for u in usages] == [len(prefix)] * REPEATS, usages
        if kv_stack.engine == "cpu":
            hits = prefix_cache_stats(kv_stack)
            for p in PREFILLS:
                gained = hits[p]["hit_tokens"] - hits_before[p]["hit_tokens"]
                assert gained == (REPEATS * len(prefix) if p == holder else 0), (p, holder, hits)
