"""Serving benchmark in the style of sglang.bench_serving / vllm bench serve.

Arms, all measured in one run with interleaved repetitions:
  engine  - the workload straight into an aggregated CPU engine in this process (the baseline);
  agg     - Dynamo frontend + one aggregated worker (`python -m components`);
  agg-separate - the same with the engine in its own process (`--cpu-engine-process separate`;
            not in the default arms);
  agg-chunked - the same with SGLang's chunked prefill and mixed batches
            (`--chunked-prefill-size 256 --enable-mixed-chunk`);
  disagg  - Dynamo frontend + decode worker + prefill worker, KV over NIXL (the workers'
            default style: frontend-orchestrated in Tokens mode);
  disagg-decode - the same, decode-orchestrated (not in the default arms; --arms to add it).
Closed loop at each concurrency (default 1, 4, 16), optional open loop (Poisson --request-rate).
Random input lengths from a fixed seed, fixed output length (`ignore_eos`), greedy.

    python -m benchmarks.bench_serving [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from benchmarks.common import (
    SMALL_MODEL,
    format_table,
    limit_cpu_threads,
    median_of_runs,
    require_model,
    results_dir,
    write_json,
)
from benchmarks.loadgen import run_closed_loop, run_open_loop, summarize
from benchmarks.serving_arms import Arms
from benchmarks.serving_report import (
    integrity_problems,
    open_loop_table,
    plot_serving,
    ratios,
    serving_rows,
)
from benchmarks.workload import Workload, length_summary, make_prompts

logger = logging.getLogger("bench_serving")
ARMS = ("engine", "agg", "agg-separate", "agg-chunked", "disagg", "disagg-decode")
DEFAULT_ARMS = ("engine", "agg", "agg-chunked", "disagg")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(SMALL_MODEL))
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma list of " + ",".join(ARMS))
    p.add_argument("--concurrency", default="1,4,16", help="closed-loop client counts")
    p.add_argument("--runs", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--input-min", type=int, default=128)
    p.add_argument("--input-max", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--request-rate",
        type=float,
        default=0.0,
        help="also run an open loop at this Poisson rate (req/s); 0 = off",
    )
    p.add_argument("--open-loop-requests", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument(
        "--text-mode",
        action="store_true",
        help="workers tokenize (ModelInput.Text) instead of the frontend",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 run")
    p.add_argument("--tag", default="", help="results name suffix: serving_<tag>.json/.png")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    args = p.parse_args(argv)
    args.name = f"serving_{args.tag}" if args.tag else "serving"
    if args.quick:
        args.concurrency, args.runs, args.min_requests, args.requests_per_client = "1,4", 1, 2, 1
        args.input_max, args.output_len = 256, 8
    args.arms = [a for a in args.arms.split(",") if a]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    unknown = set(args.arms) - set(ARMS)
    if unknown or args.runs < 1:
        p.error(f"unknown arms {sorted(unknown)}" if unknown else "--runs must be >= 1")
    return args


async def measure(args: argparse.Namespace, arms: Arms, prompts_by_c: dict) -> dict:
    """runs[arm][c] = list of per-run metric dicts, arms interleaved and rotated per repetition."""
    arms.connect(max(args.concurrency))
    names = [a for a in ARMS if a in args.arms]
    warm = prompts_by_c[args.concurrency[0]][:2]
    for name in names:  # first requests pay one-off costs (allocation, UCX wire-up)
        await run_closed_loop(arms.send[name], warm, 2, args.request_timeout)
    runs: dict = {name: {c: [] for c in args.concurrency} for name in names}
    for rep in range(args.runs):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for c in args.concurrency:
            for name in order:
                results, wall = await run_closed_loop(
                    arms.send[name], prompts_by_c[c], c, args.request_timeout
                )
                runs[name][c].append(summarize(results, wall, args.output_len))
                logger.info(
                    "run %d c=%d %s: %.1f tok/s",
                    rep,
                    c,
                    name,
                    runs[name][c][-1]["output_tok_per_s"],
                )
    if args.request_rate > 0:
        runs["open_loop"] = await measure_open_loop(args, arms, names)
    await arms.close_clients()
    return runs


async def measure_open_loop(args, arms: Arms, names: list[str]) -> dict:
    prompts = make_prompts(
        arms.tokenizer,
        Workload(
            args.open_loop_requests,
            args.input_min,
            args.input_max,
            args.output_len,
            args.seed + 1000,
        ),
    )
    out: dict = {name: [] for name in names}
    for rep in range(args.runs):
        for name in names:
            results, wall = await run_open_loop(
                arms.send[name],
                prompts,
                args.request_rate,
                args.seed + rep,
                None,
                args.request_timeout,
            )
            out[name].append(summarize(results, wall, args.output_len))
    return out


def report(args, runs: dict, prompts_by_c: dict) -> int:
    medians = {
        name: {c: median_of_runs(r) for c, r in by_c.items()}
        for name, by_c in runs.items()
        if name != "open_loop"
    }
    headers, rows = serving_rows(medians, args.concurrency)
    print(
        f"\nServing, closed loop, median of {args.runs} runs "
        f"(input {args.input_min}..{args.input_max} tokens, output {args.output_len}, greedy):"
    )
    print(format_table(headers, rows))
    problems = integrity_problems(runs)
    print(
        "\nIntegrity (tokens received == usage.completion_tokens == max_tokens; no failures): "
        + ("OK" if not problems else "; ".join(problems))
    )
    open_loop = {n: median_of_runs(r) for n, r in runs.get("open_loop", {}).items()}
    open_table = open_loop_table(open_loop) if open_loop else None
    if open_table:
        print(
            f"\nOpen loop, Poisson arrivals at {args.request_rate} req/s, "
            f"{args.open_loop_requests} requests, median of {args.runs} runs:"
        )
        print(format_table(open_table["headers"], open_table["rows"]))
    out = results_dir(args.out)
    write_json(
        out,
        args.name,
        {
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "prompt_lengths": {c: length_summary(p) for c, p in prompts_by_c.items()},
            "median": medians,
            "open_loop_median": open_loop,
            "runs": runs,
            "ratios": ratios(medians, args.concurrency),
            "integrity_problems": problems,
            "table": {"headers": headers, "rows": rows},
            "open_loop_table": open_table,
        },
    )
    plot_serving(medians, args.concurrency, out, args.name, Path(args.model_path).name)
    print(f"\nwrote {out}/{args.name}.json and {out}/{args.name}.png")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "components.engine"):  # per-request INFO lines would drown the tables
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    limit_cpu_threads(1)
    require_model(Path(args.model_path), "small")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    prompts_by_c = {
        c: make_prompts(
            tokenizer,
            Workload(
                max(args.min_requests, args.requests_per_client * c),
                args.input_min,
                args.input_max,
                args.output_len,
                args.seed + c,
            ),
        )
        for c in args.concurrency
    }
    arms = Arms(args, tokenizer)
    try:
        arms.start()
        runs = asyncio.run(measure(args, arms, prompts_by_c))
    finally:
        arms.stop()
    return report(args, runs, prompts_by_c)


if __name__ == "__main__":
    sys.exit(main())
