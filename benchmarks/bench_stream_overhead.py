"""Per-token cost of the decode handler's streaming path, against iterating the engine directly.

A synthetic engine (SGLang's Engine API shape) emits N one-token chunks as fast as it can. Arms:
  direct - iterate `engine.async_generate(...)` and count tokens (the baseline);
  tokens - `DecodeHandler.generate` in Tokens mode (token deltas);
  text   - `DecodeHandler.generate` in Text mode (OpenAI chat chunks, usage chunk at the end).
N = 1k and 16k: if the handler's work per chunk is O(1) (no re-slicing of cumulative output),
its ratio to the baseline and its microseconds per chunk are the same at both sizes. Each sample
streams max(N) chunks in total (16 requests of 1k, or 1 of 16k), so both sizes are timed over the
same amount of work.

    python -m benchmarks.bench_stream_overhead [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from benchmarks.common import (
    TINY_MODEL,
    format_table,
    median,
    new_figure,
    ratio,
    require_model,
    results_dir,
    save_figure,
    write_json,
)
from benchmarks.synthetic_engine import SyntheticEngine

ARMS = ("direct", "tokens", "text")
PROMPT = [5, 6, 7, 8]


def make_handler(arm: str, engine, tokenizer):
    from handlers.decode import DecodeConfig, DecodeHandler
    from handlers.disagg.orchestration import Orchestration
    from handlers.text.preprocess import Preprocessor

    config = DecodeConfig(
        served_model_name="bench",
        context_length=1 << 20,
        vocab_size=2048,
        orchestration=Orchestration.NONE,
        skip_tokenizer_init=(arm == "tokens"),
    )
    pre = Preprocessor(tokenizer) if arm == "text" else None
    return DecodeHandler(engine, config, preprocessor=pre), pre


def request_for(arm: str, n: int) -> dict:
    if arm == "tokens":
        return {
            "token_ids": PROMPT,
            "stop_conditions": {"max_tokens": n, "ignore_eos": True},
            "sampling_options": {"temperature": 0.0},
            "eos_token_ids": [0],
            "model": "bench",
        }
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": n,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_direct(engine, n: int) -> int:
    stream = await engine.async_generate(
        input_ids=PROMPT, sampling_params={"max_new_tokens": n}, stream=True, rid="direct"
    )
    tokens = 0
    async for chunk in stream:
        tokens += len(chunk["output_ids"])
    return tokens


async def run_handler(arm: str, handler, n: int) -> int:
    tokens = 0
    async for out in handler.generate(request_for(arm, n), None):
        if arm == "tokens":
            tokens += len(out["token_ids"])
        else:
            tokens += sum(1 for c in out["choices"] if c.get("delta", {}).get("content"))
    return tokens


async def measure(args, tokenizer) -> tuple[dict, list[str]]:
    engines = {
        "direct": SyntheticEngine(True),
        "tokens": SyntheticEngine(False),
        "text": SyntheticEngine(True),
    }
    handlers = {arm: make_handler(arm, engines[arm], tokenizer) for arm in ("tokens", "text")}
    runs: dict = {n: {arm: [] for arm in ARMS} for n in args.sizes}
    problems = []
    for n in args.sizes:
        # Every sample streams the same number of chunks (requests of N each), so small N is
        # not a few-millisecond sample at the mercy of one scheduler hiccup.
        requests = max(1, max(args.sizes) // n)
        for rep in range(args.runs + 1):  # rep 0 warms up
            for arm in ARMS[rep % 3 :] + ARMS[: rep % 3]:
                t0 = time.perf_counter()
                for _ in range(requests):
                    got = (
                        await run_direct(engines[arm], n)
                        if arm == "direct"
                        else await run_handler(arm, handlers[arm][0], n)
                    )
                    if got != n:
                        problems.append(f"{arm} N={n}: received {got} tokens, expected {n}")
                wall = time.perf_counter() - t0
                if rep:
                    runs[n][arm].append(n * requests / wall)
    for _, pre in handlers.values():
        if pre is not None:
            pre.shutdown()
    return runs, problems


def summarize(runs: dict) -> dict:
    out = {}
    for n, by_arm in runs.items():
        tput = {arm: median(v) for arm, v in by_arm.items()}
        base = tput["direct"]
        out[n] = {
            arm: {
                "tok_per_s": t,
                "ratio_vs_direct": ratio(t, base),
                "us_per_chunk": 1e6 / t,
                "added_us_per_chunk": 1e6 / t - 1e6 / base,
            }
            for arm, t in tput.items()
        }
    return out


def marginal_cost(summary: dict) -> dict:
    """µs per extra chunk between the smallest and largest N: the per-request fixed cost
    (parsing, preprocessing, the first chunk) cancels out."""
    sizes = sorted(summary)
    lo, hi = sizes[0], sizes[-1]
    out = {}
    for arm in ARMS:
        t_lo = lo * summary[lo][arm]["us_per_chunk"]
        t_hi = hi * summary[hi][arm]["us_per_chunk"]
        out[arm] = (t_hi - t_lo) / (hi - lo) if hi > lo else float("nan")
    return out


def plot(summary: dict, out: Path) -> Path:
    fig, axes = new_figure(ncols=2, width=4.4, height=3.4)
    sizes = list(summary)
    colors = {"direct": "#7f7f7f", "tokens": "#1f77b4", "text": "#2ca02c"}
    for i, arm in enumerate(ARMS):
        xs = [j + (i - 1) * 0.27 for j in range(len(sizes))]
        axes[0].bar(
            xs,
            [summary[n][arm]["tok_per_s"] / 1e3 for n in sizes],
            0.27,
            label=arm,
            color=colors[arm],
        )
        axes[1].bar(xs, [summary[n][arm]["us_per_chunk"] for n in sizes], 0.27, color=colors[arm])
    for ax, title in zip(axes, ["tokens/s (thousands)", "µs per chunk"]):
        ax.set_xticks(range(len(sizes)), [f"N={n:,}" for n in sizes])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "Decode handler streaming cost vs iterating the engine (synthetic engine)", fontsize=11
    )
    return save_figure(fig, out, "stream_overhead")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1000,16000")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--model-path", default=str(TINY_MODEL), help="for the Text-mode tokenizer")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    require_model(Path(args.model_path), "tiny")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    runs, problems = asyncio.run(measure(args, tokenizer))
    summary = summarize(runs)
    headers = ["N", "arm", "tokens/s", "ratio vs direct", "µs/chunk", "added µs/chunk"]
    rows = [
        [n, arm, s["tok_per_s"], s["ratio_vs_direct"], s["us_per_chunk"], s["added_us_per_chunk"]]
        for n, by_arm in summary.items()
        for arm, s in by_arm.items()
    ]
    print(f"\nStreaming N one-token chunks, median of {args.runs} runs:")
    print(format_table(headers, rows))
    first, last = args.sizes[0], args.sizes[-1]
    drift = {
        arm: ratio(summary[last][arm]["ratio_vs_direct"], summary[first][arm]["ratio_vs_direct"])
        for arm in ("tokens", "text")
    }
    print(
        f"\nratio at N={last:,} / ratio at N={first:,} (1.0 = per-chunk cost constant): "
        + ", ".join(f"{a} {d:.2f}" for a, d in drift.items())
    )
    marginal = marginal_cost(summary)
    print(
        "marginal µs per chunk (slope between the sizes): "
        + ", ".join(f"{a} {v:.2f}" for a, v in marginal.items())
        + f"; handler adds tokens {marginal['tokens'] - marginal['direct']:.2f}, "
        f"text {marginal['text'] - marginal['direct']:.2f} µs per chunk"
    )
    print(
        "integrity: "
        + ("every arm delivered exactly N tokens" if not problems else "; ".join(problems))
    )
    out = results_dir(args.out)
    write_json(
        out,
        "stream_overhead",
        {
            "config": {"sizes": args.sizes, "runs": args.runs},
            "median": summary,
            "runs": runs,
            "ratio_drift": drift,
            "marginal_us_per_chunk": marginal,
            "problems": problems,
            "table": {"headers": headers, "rows": rows},
        },
    )
    plot(summary, out)
    print(f"wrote {out}/stream_overhead.json and {out}/stream_overhead.png")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
