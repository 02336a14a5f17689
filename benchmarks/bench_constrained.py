"""What structured output costs the CPU engine: decode tok/s at batch 16 with every row under a
JSON schema (xgrammar bitmask per row per step, matcher advanced per token) against the same
batch unconstrained, in one run, arms alternated; plus the schema's cold compile time.

    .venv/bin/python -m benchmarks.bench_constrained [--runs 5] [--model PATH]

The schema asks for at least 32 records, so no row's grammar can end inside the measured
tokens: both arms decode exactly the same number of tokens per row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, median, new_figure, parse_engine_bench_args, results_dir,
    save_figure, write_json,
)
from components.engine.process.engine import CpuEngine

BATCH = 16
PROMPT_TOKENS = 128
DECODE_TOKENS = 64
SCHEMA = {
    "type": "array",
    "minItems": 32,
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12},
                       "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
                       "ok": {"type": "boolean"}},
        "required": ["id", "name", "tags", "ok"],
        "additionalProperties": False,
    },
}


def _prompt(vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)]


async def decode_tok_s(engine: CpuEngine, constrained: bool, seed: int) -> float:
    """Steady-state decode over the batch: tokens after each row's first, over their span."""
    params = {"temperature": 1.0, "max_new_tokens": DECODE_TOKENS, "ignore_eos": True}
    if constrained:
        params["json_schema"] = json.dumps(SCHEMA)
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(i: int) -> None:
        stream = await engine.async_generate(
            input_ids=_prompt(engine.vocab_size, seed * 100 + i),
            sampling_params={**params, "sampling_seed": seed * 100 + i}, stream=True)
        async for chunk in stream:
            meta = chunk["meta_info"]
            if meta["completion_tokens"] == 1:
                firsts.append(time.perf_counter())
        if meta["completion_tokens"] != DECODE_TOKENS:
            raise RuntimeError(f"row ended after {meta['completion_tokens']} tokens: "
                               f"{meta['finish_reason']}")
        lasts.append(time.perf_counter())

    await asyncio.gather(*(one(i) for i in range(BATCH)))
    return BATCH * (DECODE_TOKENS - 1) / (max(lasts) - max(firsts))


async def compile_ms(engine: CpuEngine) -> float:
    """A request's wait for a schema nobody compiled before (unique, so never cached)."""
    schema = {**SCHEMA, "title": f"cold-{time.time_ns()}"}
    t0 = time.perf_counter()
    await engine.async_generate(input_ids=[5, 6, 7], sampling_params={
        "json_schema": json.dumps(schema), "max_new_tokens": 1})
    return (time.perf_counter() - t0) * 1e3


async def run(args: argparse.Namespace) -> dict:
    engine = CpuEngine(model_path=str(args.model), num_threads=args.threads,
                       skip_tokenizer_init=True)
    try:
        await decode_tok_s(engine, True, seed=99)  # warm-up; compiles the schema once
        free, constrained = [], []
        for r in range(args.runs):  # alternated, so drift hits both arms alike
            free.append(await decode_tok_s(engine, False, r))
            constrained.append(await decode_tok_s(engine, True, r))
        cold = [await compile_ms(engine) for _ in range(args.runs)]
        return {"free": median(free), "constrained": median(constrained),
                "compile_ms": median(cold), "runs": args.runs,
                "samples": {"free": free, "constrained": constrained}}
    finally:
        engine.shutdown()


def main() -> None:
    parser = engine_bench_parser(__doc__, runs=5)
    args = parse_engine_bench_args(parser)
    res = asyncio.run(run(args))
    ratio = res["constrained"] / res["free"]
    print(f"CPU engine, {args.model}, batch {BATCH}, {DECODE_TOKENS} tokens per row, "
          f"median of {args.runs} runs")
    table = {"headers": ["arm", "decode tok/s"],
             "rows": [["unconstrained", res["free"]], ["JSON schema", res["constrained"]]]}
    print(format_table(table["headers"], table["rows"]))
    print(f"JSON schema / unconstrained: {ratio:.3f}x tok/s ({(1 - ratio) * 100:.1f}% cost); "
          f"cold schema compile {res['compile_ms']:.1f} ms")
    out = results_dir(args.out)
    path = write_json(out, "bench_constrained", {"model": str(args.model), "batch": BATCH,
                                                 **res, "ratio": ratio, "table": table})
    plot(res, out)
    print(f"wrote {path} and {out}/bench_constrained.png")


def plot(res: dict, out) -> None:
    fig, (ax,) = new_figure(width=4.5)
    ax.bar(["unconstrained", "JSON schema"], [res["free"], res["constrained"]])
    ax.set(title=f"decode, batch {BATCH}", ylabel="tok/s (total over the batch)")
    save_figure(fig, out, "bench_constrained")


if __name__ == "__main__":
    main()
