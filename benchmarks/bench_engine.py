"""CPU engine throughput on the `small` model: prefill tok/s, decode tok/s at batch 1 and 16,
and the embedding asyncio loop's lag while a 2,000-token prefill runs on the engine thread.

    .venv/bin/python -m benchmarks.bench_engine [--runs 3] [--threads 1] [--model PATH]

NIXL transfer GB/s against a same-size torch copy is benchmarks/bench_kv_transfer.py.
Each figure is the median over --runs; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, median, new_figure, parse_engine_bench_args, percentile,
    results_dir, save_figure, write_json,
)
from components.engine.process.engine import CpuEngine

PREFILL_LENGTHS = (128, 512, 2000)
DECODE_BATCHES = (1, 16)
DECODE_PROMPT = 128
DECODE_TOKENS = 64
TICK_S = 0.001


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


async def prefill_tok_s(engine: CpuEngine, n: int, seed: int) -> float:
    ids = _prompt(n, engine.vocab_size, seed)
    t0 = time.perf_counter()
    await engine.async_generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
    return n / (time.perf_counter() - t0)


async def decode_tok_s(engine: CpuEngine, batch: int, seed: int) -> float:
    """Steady-state decode: tokens after each row's first, over the span they took."""
    params = {"temperature": 0.0, "max_new_tokens": DECODE_TOKENS, "ignore_eos": True}
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(i: int) -> None:
        stream = await engine.async_generate(
            input_ids=_prompt(DECODE_PROMPT, engine.vocab_size, seed * 100 + i),
            sampling_params=params, stream=True)
        async for chunk in stream:
            if chunk["meta_info"]["completion_tokens"] == 1:
                firsts.append(time.perf_counter())
        lasts.append(time.perf_counter())

    await asyncio.gather(*(one(i) for i in range(batch)))
    return batch * (DECODE_TOKENS - 1) / (max(lasts) - max(firsts))


async def loop_lag_ms(engine: CpuEngine, seed: int) -> tuple[float, float, float]:
    """(p50, p99, max) lag of a 1 ms asyncio ticker during a 2,000-token prefill."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lags.append((time.perf_counter() - t0 - TICK_S) * 1e3)

    task = asyncio.create_task(ticker())
    await engine.async_generate(input_ids=_prompt(2000, engine.vocab_size, seed),
                                sampling_params={"max_new_tokens": 1})
    done.set()
    await task
    return percentile(lags, 50), percentile(lags, 99), max(lags)


async def run(args: argparse.Namespace) -> dict:
    engine = CpuEngine(model_path=str(args.model), num_threads=args.threads)
    try:
        await prefill_tok_s(engine, 64, seed=0)  # warm-up
        out: dict = {"threads": args.threads, "prefill": {}, "decode": {}}
        for n in PREFILL_LENGTHS:
            runs = [await prefill_tok_s(engine, n, r) for r in range(args.runs)]
            out["prefill"][n] = median(runs)
        for b in DECODE_BATCHES:
            out["decode"][b] = median([await decode_tok_s(engine, b, r) for r in range(args.runs)])
        lag = [await loop_lag_ms(engine, r) for r in range(args.runs)]
        keys = ("p50", "p99", "max")
        out["loop_lag_ms"] = {k: median(v[i] for v in lag) for i, k in enumerate(keys)}
        return out
    finally:
        engine.shutdown()


def main() -> None:
    parser = engine_bench_parser(__doc__, runs=3)
    args = parse_engine_bench_args(parser)
    res = asyncio.run(run(args))
    rows = [[f"prefill {n} tokens", "tok/s", v] for n, v in res["prefill"].items()]
    rows += [[f"decode batch {b}", "tok/s", v] for b, v in res["decode"].items()]
    rows += [[f"loop lag {k} (2,000-token prefill)", "ms", v]
             for k, v in res["loop_lag_ms"].items()]
    print(f"CPU engine, {args.model}, {args.threads} torch thread(s), median of {args.runs} runs")
    print(format_table(["measure", "unit", "value"], rows))
    batch_ratio = res["decode"][DECODE_BATCHES[-1]] / res["decode"][DECODE_BATCHES[0]]
    print(f"decode batch {DECODE_BATCHES[-1]} / batch {DECODE_BATCHES[0]}: {batch_ratio:.2f}x tok/s")
    out = results_dir(args.out)
    path = write_json(out, "bench_engine", {"model": str(args.model), **res,
                                            "decode_batch_ratio": batch_ratio})
    plot(res, out)
    print(f"wrote {path} and {out}/bench_engine.png")


def plot(res: dict, out) -> None:
    fig, (prefill_ax, decode_ax) = new_figure(ncols=2, width=4.5)
    prefill_ax.bar([str(n) for n in res["prefill"]], list(res["prefill"].values()))
    prefill_ax.set(title="prefill", xlabel="prompt tokens", ylabel="tok/s")
    decode_ax.bar([f"batch {b}" for b in res["decode"]], list(res["decode"].values()))
    decode_ax.set(title="decode (total over the batch)", ylabel="tok/s")
    save_figure(fig, out, "bench_engine")


if __name__ == "__main__":
    main()
