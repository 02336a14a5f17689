"""Dynamo's KV router on the real stack: `dynamo.frontend --router-mode kv`, two aggregated CPU
engine workers publishing KV events. A request that shares a long prefix with an earlier one goes
to the worker whose prefix cache holds it; each worker's `/engine/prefix_cache` counters say
which worker served it (its cache hits grow, the other's stay)."""

from __future__ import annotations

import random

import pytest

from harness.kv_routing import WORKERS, prefix_cache_stats, start_kv_routed
from tests.e2e.client import completion
from tests.support.topologies import ENGINE_ARGS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVED = "tiny-kv"
PREFIX_PAGES = 30  # 480 tokens: page size 16 (ENGINE_ARGS)


@pytest.fixture(scope="module")
def kv_stack(tmp_path_factory, tiny_model_path):
    stack = start_kv_routed(tmp_path_factory.mktemp("kv-routing"), tiny_model_path, SERVED,
                            "kv", ENGINE_ARGS)
    yield stack
    stack.stop()


def send(http, stack, ids):
    # ignore_eos: sampled at temperature 1, the model may end at its first token
    out = completion(http, stack.url, {"model": SERVED, "prompt": ids, "max_tokens": 2,
                                       "ignore_eos": True})
    assert out["usage"]["completion_tokens"] == 2


def test_a_repeated_prefix_goes_to_the_worker_that_caches_it(kv_stack, http):
    rng = random.Random(7)
    for _ in range(2):  # two unrelated prefixes, each wherever the router first puts it
        prefix = [rng.randrange(100, 2000) for _ in range(PREFIX_PAGES * 16)]
        before = prefix_cache_stats(kv_stack)
        send(http, kv_stack, prefix + [1])
        after = prefix_cache_stats(kv_stack)
        holders = [w for w in WORKERS if after[w]["cached_pages"] > before[w]["cached_pages"]]
        assert len(holders) == 1, (before, after)
        holder = holders[0]
        for i in range(3):
            send(http, kv_stack, prefix + [2 + i, 3 + i])
        final = prefix_cache_stats(kv_stack)
        for w in WORKERS:
            gained = final[w]["hit_tokens"] - after[w]["hit_tokens"]
            assert gained == (3 * len(prefix) if w == holder else 0), (w, holder, after, final)
