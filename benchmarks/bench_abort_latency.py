"""How long an abort, and a short request, wait behind a long prefill, against the prompt length
and SGLang's chunked prefill (the CPU engine's default chunk vs none).

    .venv/bin/python -m benchmarks.bench_abort_latency [--runs 3] [--lengths 1000,2000,4000,7000]

Per prompt length and chunk setting, on the `small` model in process: a long prompt is sent,
and once its prefill is under way (a fixed 20 ms after it was sent) it is aborted by rid and a
16-token request is sent. "abort" is the time from the abort to the long stream's end (its
pages are free then); "short TTFT" is the short request's time to its first token. Without
chunking both wait for the whole prompt's forward; with it, for one chunk. Medians over --runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, median, parse_engine_bench_args, results_dir, write_json,
)
from components.engine.config import DEFAULT_CHUNKED_PREFILL_SIZE
from components.engine.process.engine import CpuEngine

ONE_TOKEN = {"temperature": 0.0, "max_new_tokens": 1}
STARTED_S = 0.02  # the long prompt's prefill is under way by then
CHUNKS = {"none": -1, f"{DEFAULT_CHUNKED_PREFILL_SIZE} (default)": DEFAULT_CHUNKED_PREFILL_SIZE}


async def drain(stream) -> None:
    async for _ in stream:
        pass


async def once(engine: CpuEngine, n: int, rng: random.Random, rid: str) -> tuple[float, float]:
    long_ids = [rng.randrange(3, engine.vocab_size) for _ in range(n)]
    stream = await engine.async_generate(input_ids=long_ids, sampling_params=ONE_TOKEN,
                                         stream=True, rid=rid)
    reading = asyncio.ensure_future(drain(stream))
    await asyncio.sleep(STARTED_S)
    t0 = time.perf_counter()
    engine.tokenizer_manager.abort_request(rid)
    short = asyncio.ensure_future(engine.async_generate(
        input_ids=[rng.randrange(3, engine.vocab_size) for _ in range(16)],
        sampling_params=ONE_TOKEN))
    await reading
    aborted = time.perf_counter() - t0
    await short
    return aborted * 1e3, (time.perf_counter() - t0) * 1e3


async def run(args: argparse.Namespace) -> dict:
    rows = []
    for name, chunk in CHUNKS.items():
        engine = CpuEngine(model_path=str(args.model), num_threads=args.threads,
                           chunked_prefill_size=chunk, disable_radix_cache=True,
                           context_length=max(args.lengths) + 16,
                           max_prefill_tokens=max(args.lengths) + 16)
        rng = random.Random(0)
        try:
            await once(engine, 64, rng, "warmup")
            for n in args.lengths:
                got = [await once(engine, n, rng, f"{name}-{n}-{i}") for i in range(args.runs)]
                rows.append([name, n, median(g[0] for g in got), median(g[1] for g in got)])
        finally:
            engine.shutdown()
    return {"rows": rows}


def main() -> None:
    parser = engine_bench_parser(__doc__, runs=3)
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1000, 2000, 4000, 7000])
    args = parse_engine_bench_args(parser)
    result = asyncio.run(run(args))
    print(format_table(["chunked prefill", "prompt tokens", "abort (ms)", "short TTFT (ms)"],
                       result["rows"], digits=1))
    write_json(results_dir(args.out), "abort_latency", result)


if __name__ == "__main__":
    main()
