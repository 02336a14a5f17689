"""What Dynamo's KV router saves: time to first token with `--router-mode kv` against
`--router-mode round-robin`, side by side in one run.

    .venv/bin/python -m benchmarks.bench_kv_routing [--runs 3] [--prefixes 6] [--repeats 3]
                                                   [--arms agg,disagg]

Per arm, two stacks start together (`harness/kv_routing.py`), on the `small` model, the real
`dynamo.frontend` and CPU-engine workers with KV events; they differ only in the router mode:
- `agg`: two aggregated workers;
- `disagg`: two prefill workers and one decode worker, frontend-orchestrated, so the router
  mode picks the prefill worker (the frontend's prefill router).
The workload: `--prefixes` long prefixes (`--prefix-tokens`), each sent `1 + --repeats` times
with a fresh 16-token suffix, in a seeded shuffled order; each request goes to both stacks in
turn, one request at a time (streaming /v1/completions, token-id prompts). The KV router sends a
repeat to the worker that cached its prefix; round-robin alternates, so a prefix is prefilled in
full on each worker. TTFT is the first streamed token's arrival; the (prefill) workers'
`/engine/prefix_cache` counters give the prompt tokens served from cache. Each arm writes its
own JSON: `bench_kv_routing` (agg), `bench_kv_routing_disagg`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import (
    SMALL_MODEL, format_table, median, require_model, results_dir, write_json,
)
from harness.kv_routing import (
    ROUTER_MODES, prefix_cache_stats, start_kv_routed, start_kv_routed_disagg, wait_ready,
    wait_ready_disagg,
)

SUFFIX = 16
ENGINE_ARGS = ("--page-size", "16", "--context-length", "4096", "--log-level", "warning")
# arm -> (start a stack without waiting, wait for it, JSON name, what serves)
ARMS = {
    "agg": (start_kv_routed, wait_ready, "bench_kv_routing", "2 aggregated workers"),
    "disagg": (start_kv_routed_disagg, wait_ready_disagg, "bench_kv_routing_disagg",
               "2 prefill + 1 decode workers, frontend-orchestrated"),
}


def ttft_ms(http: httpx.Client, url: str, served: str, ids: list[int]) -> float:
    """The first token's arrival; the stream is read to its end (2 tokens), so every request
    finishes normally rather than by a client disconnect."""
    body = {"model": served, "prompt": ids, "max_tokens": 2, "stream": True}
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:]).get("choices"):
                    first = (time.perf_counter() - t0) * 1e3
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


def workload(args: argparse.Namespace, vocab: int, seed: int) -> list[tuple[bool, list[int]]]:
    """(is the prefix's first request, prompt ids), shuffled; a prefix's first comes first."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(args.prefix_tokens)]
                for _ in range(args.prefixes)]
    order = [p for p in range(args.prefixes) for _ in range(1 + args.repeats)]
    rng.shuffle(order)
    seen: set[int] = set()
    out = []
    for p in order:
        out.append((p not in seen, prefixes[p] + [rng.randrange(3, vocab) for _ in range(SUFFIX)]))
        seen.add(p)
    return out


def one_run(stacks: dict, served: str, args: argparse.Namespace, vocab: int, seed: int) -> dict:
    before = {m: prefix_cache_stats(s) for m, s in stacks.items()}
    ttft: dict[str, dict[str, list[float]]] = {m: {"first": [], "repeat": []} for m in stacks}
    with httpx.Client(timeout=60) as http:
        for first, ids in workload(args, vocab, seed):
            for mode, stack in stacks.items():
                ttft[mode]["first" if first else "repeat"].append(
                    ttft_ms(http, stack.url, served, ids))
    out = {}
    for mode, stack in stacks.items():
        after = prefix_cache_stats(stack)
        hits = sum(after[w]["hit_tokens"] - before[mode][w]["hit_tokens"] for w in after)
        out[mode] = {"first_ms": median(ttft[mode]["first"]),
                     "repeat_ms": median(ttft[mode]["repeat"]),
                     "repeat_mean_ms": sum(ttft[mode]["repeat"]) / len(ttft[mode]["repeat"]),
                     "cached_tokens": hits}
    return out


def run_arm(arm: str, args: argparse.Namespace, served: str, vocab: int) -> list[dict]:
    """Both router modes' stacks of `arm`, started together; one result per run."""
    start, wait, _, _ = ARMS[arm]
    dirs = {m: Path(tempfile.mkdtemp(prefix=f"bench-kvroute-{arm}-{m}-")) for m in ROUTER_MODES}
    stacks = {}
    failed = True
    try:
        for mode in ROUTER_MODES:  # both start before either is waited for
            stacks[mode] = start(dirs[mode], str(args.model), served, mode, ENGINE_ARGS,
                                 namespace=f"kvr{arm}{mode[:2]}", wait=False)
        for stack in stacks.values():
            wait(stack, served)
        # Each run uses fresh prefixes, so every run starts from cold caches for its workload.
        runs = [one_run(stacks, served, args, vocab, seed) for seed in range(args.runs)]
        failed = False
    finally:
        for stack in stacks.values():
            stack.stop()
        for d in dirs.values():
            if failed or os.environ.get("BENCH_KEEP_LOGS") == "1":
                print(f"logs kept in {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)
    return runs


def report(arm: str, args: argparse.Namespace, served: str, runs: list[dict]) -> None:
    _, _, name, workers = ARMS[arm]
    res = {m: {k: median(r[m][k] for r in runs) for k in runs[0][m]} for m in ROUTER_MODES}
    headers = ["router mode", "first-of-prefix TTFT ms", "repeat TTFT p50 ms",
               "repeat TTFT mean ms", "prompt tokens from cache"]
    rows = [[m, res[m]["first_ms"], res[m]["repeat_ms"], res[m]["repeat_mean_ms"],
             res[m]["cached_tokens"]] for m in ROUTER_MODES]
    saved = res["round-robin"]["repeat_mean_ms"] - res["kv"]["repeat_mean_ms"]
    print(f"KV routing vs round-robin, {served}, {workers}, {args.prefixes} prefixes x "
          f"{1 + args.repeats} requests of {args.prefix_tokens}+{SUFFIX} tokens, "
          f"median of {args.runs} runs")
    print(format_table(headers, rows))
    print(f"KV routing saves {saved:.1f} ms of mean TTFT per repeated-prefix request")
    path = write_json(results_dir(args.out), name, {
        "config": {**vars(args), "model": str(args.model), "arm": arm}, "runs": args.runs,
        "result": res, "repeat_mean_ttft_saved_ms": saved,
        "table": {"headers": headers, "rows": rows}})
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=SMALL_MODEL)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prefixes", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="requests after a prefix's first")
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated: agg, disagg")
    parser.add_argument("--out", default=None, help="results directory")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"--arms: unknown {sorted(unknown)}; choose from {list(ARMS)}")
    if args.model == SMALL_MODEL:
        require_model(SMALL_MODEL, "small")
    served = Path(args.model).name
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    for arm in arms:  # one arm at a time: on 2 cores, two arms' stacks would disturb each other
        report(arm, args, served, run_arm(arm, args, served, vocab))


if __name__ == "__main__":
    main()
