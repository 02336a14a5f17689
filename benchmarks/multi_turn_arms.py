"""The multi-turn benchmark's arms (benchmarks/bench_multi_turn.py), per engine.

- `--engine cpu`: `disagg`, `disagg-cache` (its decode with
  `--disaggregation-decode-enable-radix-cache`) and `agg`, this worker on the CPU engine
  (benchmarks/serving_arms.py's topologies).
- `--engine sglang`: `disagg` and `disagg-cache`, this worker on `sglang.Engine`, and
  `dynamo-disagg-cache`, Dynamo 1.6.1's own SGLang worker with the same decode flag
  (benchmarks/aiperf_arms.py's arms, SGLang's CPU path), their prefills with `--enable-metrics`.
Each arm's KV bytes: `harness.decode_cache.kv_bytes` of its prefill worker.
"""

from __future__ import annotations

from harness.decode_cache import DECODE_CACHE
from harness.topology import Stack

ARMS = {"cpu": ("disagg", "disagg-cache", "agg"),
        "sglang": ("disagg", "disagg-cache", "dynamo-disagg-cache")}
# The arm whose prompt, answer and held share the tables report: the decode without a cache.
REFERENCE = "disagg"


def disagg_arms(engine: str) -> tuple[str, ...]:
    return tuple(arm for arm in ARMS[engine] if "disagg" in arm)


def spawn(engine: str, arm: str, model_path: str, served: str) -> Stack:
    """The processes of `arm` on `engine` (Tokens mode), not yet ready."""
    if engine == "cpu":
        from benchmarks.serving_arms import spawn_topology

        return spawn_topology(arm, model_path, served, True)
    from benchmarks.aiperf_arms import spawn_sglang

    name = "dynamo-sglang-disagg" if arm.startswith("dynamo") else "disagg-sglang"
    return spawn_sglang(name, model_path, served, prefill_args=("--enable-metrics",),
                        decode_args=DECODE_CACHE if arm.endswith("-cache") else ())
