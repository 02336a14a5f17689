"""CPU engine decode throughput at batch 16 with logprobs (``top_logprobs_num`` 5) and without,
side by side in one run (arms alternate per run, same prompts), on the `small` model.

    .venv/bin/python -m benchmarks.bench_logprobs [--runs 5] [--threads 1] [--model PATH]

The cost is the per-step ``log_softmax`` + ``topk`` of the rows that asked, and the per-chunk
tuples (components/engine/output/logprobs.py). Goal: under 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, median, parse_engine_bench_args, results_dir, write_json,
)
from components.engine.process.engine import CpuEngine

BATCH = 16
PROMPT = 128
NEW_TOKENS = 64
TOP = 5
ARMS = {"without logprobs": {}, f"logprobs, top {TOP}": {"return_logprob": True,
                                                          "top_logprobs_num": TOP}}


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


async def decode_tok_s(engine: CpuEngine, seed: int, kwargs: dict) -> float:
    """Steady-state decode: tokens after each row's first, over the span they took."""
    params = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(i: int) -> None:
        stream = await engine.async_generate(
            input_ids=_prompt(PROMPT, engine.vocab_size, seed * 100 + i),
            sampling_params=params, stream=True, **kwargs)
        async for chunk in stream:
            if chunk["meta_info"]["completion_tokens"] == 1:
                firsts.append(time.perf_counter())
        lasts.append(time.perf_counter())

    await asyncio.gather(*(one(i) for i in range(BATCH)))
    return BATCH * (NEW_TOKENS - 1) / (max(lasts) - max(firsts))


async def run(args: argparse.Namespace) -> dict[str, float]:
    # No prefix cache: both arms see the same prompts, the second must not reuse the first's KV.
    engine = CpuEngine(model_path=str(args.model), num_threads=args.threads,
                       disable_radix_cache=True)
    try:
        await decode_tok_s(engine, 99, {})  # warm-up
        runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(args.runs):
            for arm, kwargs in ARMS.items():
                runs[arm].append(await decode_tok_s(engine, r, kwargs))
        return {arm: median(v) for arm, v in runs.items()}
    finally:
        engine.shutdown()


def main() -> None:
    parser = engine_bench_parser(__doc__, runs=5)
    args = parse_engine_bench_args(parser)
    res = asyncio.run(run(args))
    base, with_lp = res.values()
    print(f"CPU engine, {args.model}, decode batch {BATCH}, {args.threads} torch thread(s), "
          f"median of {args.runs} runs")
    print(format_table(["arm", "tok/s"], [[arm, v] for arm, v in res.items()]))
    print(f"logprobs cost: {(1 - with_lp / base) * 100:.1f}% of decode tok/s")
    path = write_json(results_dir(args.out), "bench_logprobs",
                      {"model": str(args.model), "batch": BATCH, "top_logprobs_num": TOP,
                       "tok_s": res, "ratio": with_lp / base, "runs": args.runs,
                       "table": {"headers": ["arm", "tok/s"],
                                 "rows": [[arm, v] for arm, v in res.items()]}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
