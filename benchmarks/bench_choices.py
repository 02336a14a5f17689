"""`n > 1` on the CPU engine: one request with n choices (the prompt prefilled once and forked)
against n concurrent single requests with the same prompt and the choices' seeds.

    .venv/bin/python -m benchmarks.bench_choices [--runs 3] [--n 8] [--prompt-len 1024]

Both arms get the same work (seeded sampling, `ignore_eos`): choice i of the forked request
samples with seed + i, so its tokens must equal those of the single request with that seed
(reported). Wall time from submission to the last token; the arms alternate within each
repetition and each is warmed up once. The prefix cache is off, so the single requests cannot
share the prompt's KV either way (they arrive together, before any of them finished).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, limit_cpu_threads, median, new_figure,
    parse_engine_bench_args, ratio, results_dir, save_figure, write_json,
)

ARMS = ("forked", "separate")
SEED = 1234


def run_arm(engine, arm: str, prompt: list[int], n: int, new_tokens: int) -> list[list[int]]:
    params = {"temperature": 0.8, "max_new_tokens": new_tokens, "ignore_eos": True}

    async def go() -> list[list[int]]:
        if arm == "forked":
            outs = await engine.async_generate(
                input_ids=prompt, sampling_params={**params, "n": n, "sampling_seed": SEED})
            return [o["output_ids"] for o in outs]
        outs = await asyncio.gather(*(engine.async_generate(
            input_ids=prompt, sampling_params={**params, "sampling_seed": SEED + i})
            for i in range(n)))
        return [o["output_ids"] for o in outs]

    return asyncio.run(go())


def measure(args: argparse.Namespace) -> dict:
    from components.engine.process.engine import CpuEngine

    limit_cpu_threads(args.threads)
    engine = CpuEngine(model_path=args.model, num_threads=args.threads,
                       disable_radix_cache=True)
    try:
        rng = random.Random(0)
        warm = [rng.randrange(3, engine.vocab_size) for _ in range(16)]
        for arm in ARMS:
            run_arm(engine, arm, warm, 2, 2)
        secs = {arm: [] for arm in ARMS}
        same = []
        for r in range(args.runs):
            prompt = [rng.randrange(3, engine.vocab_size) for _ in range(args.prompt_len)]
            outs = {}
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                t0 = time.perf_counter()
                outs[arm] = run_arm(engine, arm, prompt, args.n, args.new_tokens)
                secs[arm].append(time.perf_counter() - t0)
            same.append(outs["forked"] == outs["separate"])
    finally:
        engine.shutdown()
    med = {arm: median(v) for arm, v in secs.items()}
    return {"seconds": med, "runs_seconds": secs, "tokens_identical": all(same),
            "speedup": ratio(med["separate"], med["forked"])}


def main() -> None:
    p = engine_bench_parser(__doc__, runs=3)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=16)
    args = parse_engine_bench_args(p)
    logging.basicConfig(level=logging.WARNING)
    res = measure(args)
    res["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    rows = [[arm, res["seconds"][arm]] for arm in ARMS]
    res["table"] = {"headers": ["arm", "wall s"], "rows": rows}
    print(f"n={args.n}, {args.prompt_len}-token prompt, {args.new_tokens} new tokens per choice, "
          f"median of {args.runs} runs")
    print(format_table(["arm", "wall s"], rows))
    print(f"one request with n={args.n} vs {args.n} single requests: {res['speedup']:.2f}x "
          f"faster; tokens identical: {'yes' if res['tokens_identical'] else 'no'}")
    out = results_dir(args.out)
    path = write_json(out, "bench_choices", res)
    fig, (ax,) = new_figure(ncols=1, width=4.5)
    ax.bar(list(res["seconds"]), list(res["seconds"].values()))
    ax.set(title=f"n={args.n}, {args.prompt_len}-token prompt", ylabel="wall s")
    save_figure(fig, out, "bench_choices")
    print(f"wrote {path} and {out}/bench_choices.png")


if __name__ == "__main__":
    main()
