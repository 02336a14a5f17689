"""One DP rank's KV cache as Dynamo's standard component gauges report it
(`dynamo_component_total_blocks`, `_gpu_cache_usage_percent`, `_kv_cache_hit_rate`;
components/worker/metrics/component_gauges.py), read from whichever engine runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KvLoad:
    dp_rank: int
    total_blocks: int   # KV pages (blocks) in the pool
    usage: float        # share of the pool held by requests, 0.0-1.0 (prefix cache excluded)
    hit_rate: float     # share of prompt tokens served from the prefix cache, 0.0-1.0


def blocks(tokens: int, page_size: int) -> int:
    """Tokens -> KV blocks, rounded up (Dynamo 1.6.1's `tokens_to_kv_blocks`)."""
    return -(-tokens // page_size) if page_size > 1 else tokens
