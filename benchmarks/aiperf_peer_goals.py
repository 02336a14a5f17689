"""The aiperf goals against both peers a user would pick instead (bench_aiperf.json): this
worker on `--engine sglang` at least as fast as the faster of Dynamo 1.6.1's `python -m
dynamo.sglang` and SGLang's own server behind smg (`sglang-native`), on output tok/s and TTFT
p50, aggregated and disaggregated; a goal not met says how far the ratio moved run by run
against that peer (each run against the peer's run of the same repetition)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import fmt
from benchmarks.goal import Goal, Load

# (this worker's arm, its peers' arms)
PEERS = (("agg-sglang", ("dynamo-sglang", "sglang-native")),
         ("disagg-sglang", ("dynamo-sglang-disagg", "sglang-native-disagg")))
# (what, median key, target, higher is better)
MEASURES = (("output tok/s", "output_tok_per_s", ">= 1.0x", True),
            ("TTFT p50", "ttft_p50_ms", "<= 1.0x", False))


def _spread(runs: dict[str, list[dict[str, Any]]], arm: str, peer: str, key: str) -> str:
    ratios = [a[key] / p[key] for a, p in zip(runs.get(arm) or [], runs.get(peer) or [])
              if a.get(key) and p.get(key)]
    if not ratios:
        return ""
    return (f"against {peer}, run by run this ratio went from {fmt(min(ratios))}x to "
            f"{fmt(max(ratios))}x")


def peer_goals(load: Load) -> list[Goal]:
    data = load("bench_aiperf") or {}
    medians, runs = data.get("median") or {}, data.get("runs") or {}
    out = []
    for arm, peers in PEERS:
        for what, key, target, higher in MEASURES:
            label = f"aiperf: {arm} {what} / the faster peer's"
            values = {p: (medians.get(p) or {}).get(key) for p in peers}
            values = {p: v for p, v in values.items() if v}
            mine = (medians.get(arm) or {}).get(key)
            if not mine or not values:
                out.append(Goal(label, target))
                continue
            best = (max if higher else min)(values, key=values.get)
            ratio = mine / values[best]
            met = ratio >= 1.0 if higher else ratio <= 1.0
            measured = f"{fmt(ratio)}x (the faster: {best})"
            out.append(Goal(label, target, measured, met,
                            "" if met else _spread(runs, arm, best, key)))
    return out
