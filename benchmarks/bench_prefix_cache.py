"""The CPU engine's prefix cache: what a repeated long prefix costs against its first prefill.

    .venv/bin/python -m benchmarks.bench_prefix_cache [--runs 3] [--lengths 512,2000]

Per prefix length, on the `small` model: time to first token of a prompt whose prefix the engine
has not seen (cold: the whole prompt is prefilled), then of a prompt with the same prefix and a
new 16-token suffix (warm: the cached whole pages are copied, only the rest is prefilled). The
same engine serves both, in process, one request at a time. Each figure is the median over --runs
fresh prefixes.
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

SUFFIX = 16
ONE_TOKEN = {"temperature": 0.0, "max_new_tokens": 1}


def _ids(n: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


async def ttft_ms(engine: CpuEngine, ids: list[int]) -> tuple[float, int]:
    """(time to the first token in ms, cached tokens) of one request."""
    t0 = time.perf_counter()
    out = await engine.async_generate(input_ids=ids, sampling_params=ONE_TOKEN)
    return (time.perf_counter() - t0) * 1e3, out["meta_info"]["cached_tokens"]


async def run(args: argparse.Namespace) -> dict:
    engine = CpuEngine(model_path=str(args.model), num_threads=args.threads)
    rng = random.Random(0)
    try:
        await ttft_ms(engine, _ids(64, engine.vocab_size, rng))  # warm-up
        rows = []
        for n in args.lengths:
            cold, warm, cached = [], [], []
            for _ in range(args.runs):
                prefix = _ids(n, engine.vocab_size, rng)
                ms, _ = await ttft_ms(engine, prefix + _ids(SUFFIX, engine.vocab_size, rng))
                cold.append(ms)
                ms, hit = await ttft_ms(engine, prefix + _ids(SUFFIX, engine.vocab_size, rng))
                warm.append(ms)
                cached.append(hit)
            rows.append([n + SUFFIX, median(cached), median(cold), median(warm),
                         median(warm) / median(cold)])
        return {"rows": rows}
    finally:
        engine.shutdown()


def main() -> None:
    parser = engine_bench_parser(__doc__, runs=3)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                        default=[512, 2000], help="prefix lengths in tokens")
    args = parse_engine_bench_args(parser)
    res = asyncio.run(run(args))
    headers = ["prompt tokens", "cached tokens", "cold TTFT ms", "repeated-prefix TTFT ms",
               "repeated / cold"]
    print(f"CPU engine prefix cache, {args.model}, median of {args.runs} runs")
    print(format_table(headers, res["rows"]))
    path = write_json(results_dir(args.out), "bench_prefix_cache", {
        "model": str(args.model), "runs": args.runs,
        "table": {"headers": headers, "rows": res["rows"]}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
