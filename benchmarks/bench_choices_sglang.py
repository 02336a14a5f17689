"""`n > 1` on a disaggregated `sglang.Engine` pair behind the real frontend: what each extra
choice costs a request (Tokens mode, the default orchestration: the frontend's).

    .venv/bin/python -m benchmarks.bench_choices_sglang [--runs 20] [--n 1,2,4] [--words 400]

SGLang's PD decode cannot fork a request whose KV it adopted, so the worker runs one request per
choice in rooms room + i on both legs, the prefill's radix cache warmed first
(docs/reference/orchestration.md, "n > 1"); each choice's KV moves in its own transfer. Every
request asks one token per choice (the cost is the prefill and the transfers), at temperature
0.7 with top_k 1 (the 1.6.1 frontend refuses n > 1 at temperature 0; top_k 1 is greedy), and
each answer must carry n choices. The values of n alternate within each repetition; the
reported figure is the median wall time per n and the slope per extra choice.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import httpx

from benchmarks.aiperf_arms import READY_S, spawn_sglang
from benchmarks.common import (
    SMALL_MODEL, format_table, median, new_figure, require_model, results_dir, save_figure,
    write_json,
)

ARM = "disagg-sglang"


def one(http: httpx.Client, url: str, served: str, prompt: str, n: int) -> float:
    body = {"model": served, "messages": [{"role": "user", "content": prompt}], "n": n,
            "max_tokens": 1, "temperature": 0.7, "top_k": 1, "ignore_eos": True}
    t0 = time.perf_counter()
    r = http.post(f"{url}/v1/chat/completions", json=body)
    took = time.perf_counter() - t0
    r.raise_for_status()
    got = sorted(c["index"] for c in r.json()["choices"])
    if got != list(range(n)):
        raise RuntimeError(f"n={n}: the answer carried choices {got}")
    return took


def measure(args: argparse.Namespace) -> dict:
    served = Path(args.model_path).name
    stack = spawn_sglang(ARM, args.model_path, served)
    secs: dict[int, list[float]] = {n: [] for n in args.n}
    try:
        stack.wait_ready(served, timeout=READY_S, probe=True)
        prompt = " ".join(f"word{i % 97}" for i in range(args.words))
        with httpx.Client(timeout=120) as http:
            for n in args.n:  # warm-up: the prompt in the prefill's radix cache, every n once
                one(http, stack.url, served, prompt, n)
            for r in range(args.runs):
                for n in (args.n if r % 2 == 0 else args.n[::-1]):
                    secs[n].append(one(http, stack.url, served, prompt, n))
    finally:
        stack.stop()
    med = {n: median(v) for n, v in secs.items()}
    lo, hi = min(args.n), max(args.n)
    per_choice = (med[hi] - med[lo]) / (hi - lo) if hi > lo else 0.0
    return {"seconds": med, "runs_seconds": secs, "per_extra_choice_s": per_choice}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--n", default="1,2,4", help="comma list of n")
    p.add_argument("--words", type=int, default=400, help="prompt length in words")
    p.add_argument("--model-path", default=str(SMALL_MODEL))
    p.add_argument("--out", default=None, help="results directory")
    args = p.parse_args()
    args.n = [int(v) for v in args.n.split(",")]
    logging.basicConfig(level=logging.WARNING)
    if args.model_path == str(SMALL_MODEL):
        require_model(SMALL_MODEL, "small")
    res = measure(args)
    res["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    rows = [[n, 1000 * res["seconds"][n]] for n in args.n]
    res["table"] = {"headers": ["n", "wall ms"], "rows": rows}
    print(f"{ARM}, {Path(args.model_path).name}: a {args.words}-word prompt, one token per "
          f"choice, median of {args.runs}")
    print(format_table(["n", "wall ms"], rows, digits=1))
    print(f"each extra choice: {res['per_extra_choice_s']:.3f} s")
    out = results_dir(args.out)
    path = write_json(out, "bench_choices_sglang", res)
    fig, (ax,) = new_figure(ncols=1, width=4.5)
    ax.bar([str(n) for n in args.n], [res["seconds"][n] for n in args.n])
    ax.set(title=f"{ARM}, n choices of one token", xlabel="n", ylabel="wall s")
    save_figure(fig, out, "bench_choices_sglang")
    print(f"wrote {path} and {out}/bench_choices_sglang.png")


if __name__ == "__main__":
    main()
