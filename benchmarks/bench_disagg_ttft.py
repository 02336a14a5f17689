"""Where disaggregation's extra TTFT goes: prefill compute, KV transfer, hand-off.

Engine level, one request at a time, so nothing else is in the numbers:
  agg    - an aggregated CPU engine in this process: TTFT = prefill compute + the rest;
  disagg - a prefill engine in another process (harness/engine_proc.py) and a decode engine in
           this one, meeting through the bootstrap server with real NIXL, as the workers do.
Split of the disaggregated TTFT (times from the engines' own records, harness/engine_timing.py):
  compute  - the prefill forward on the prefill engine;
  transfer - end of the prefill forward -> KV WRITE complete (descriptors, NIXL/UCX write between
             the processes; decode has registered its pages during the forward);
  hand-off - everything else: getting the request to the prefill engine (dispatch), and after the
             WRITE the notification, decode adopting the request and delivering the first token.

    python -m benchmarks.bench_disagg_ttft [--lengths 128,512,1024,2048,4096] [--runs 3]
        [--ucx-error-handling none|peer]   (both engines' --cpu-kv-ucx-error-handling)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from pathlib import Path

from benchmarks.common import (
    SMALL_MODEL,
    format_table,
    limit_cpu_threads,
    median,
    require_model,
    results_dir,
    write_json,
)
from benchmarks.disagg_report import plot_split, split_rows
from harness.engine_proc import EngineProcess
from harness.engine_timing import TimingCapture

SAMPLING = {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}


async def first_token(stream) -> tuple[float, list[int], dict]:
    """Time of the first token, all tokens, and the last meta_info (drains the stream)."""
    t_first, ids, meta = None, [], {}
    async for chunk in stream:
        if chunk["output_ids"] and t_first is None:
            t_first = time.time()
        ids += chunk["output_ids"]
        meta = chunk["meta_info"]
    return t_first, ids, meta


async def run_agg(engine, capture: TimingCapture, ids: list[int]) -> dict:
    rid = uuid.uuid4().hex
    t0 = time.time()
    stream = await engine.async_generate(
        input_ids=ids, sampling_params=SAMPLING, stream=True, rid=rid
    )
    t_first, out, meta = await first_token(stream)
    ttft = (t_first - t0) * 1e3 if t_first else float("nan")
    compute = capture.prefill.get(rid, (None, float("nan")))[1]
    return {
        "ttft_ms": ttft,
        "compute_ms": compute,
        "other_ms": ttft - compute,
        "tokens": out,
        "finish": meta.get("finish_reason"),
    }


async def run_disagg(decode, prefill: EngineProcess, ids: list[int]) -> dict:
    rid, room = uuid.uuid4().hex, random.randrange(1, 1 << 63)
    boot = {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.server_args["disaggregation_bootstrap_port"],
        "bootstrap_room": room,
    }
    t0 = time.time()
    # Sent on the call, as the decode handler does: the prefill hears of the request first.
    done = asyncio.create_task(
        prefill.final(input_ids=ids, sampling_params=SAMPLING, rid=rid + "-p", **boot)
    )
    stream = await decode.async_generate(
        input_ids=ids, sampling_params=SAMPLING, stream=True, rid=rid, **boot
    )
    t_first, out, meta = await first_token(stream)
    p = await asyncio.wait_for(done, 60)
    times = await prefill.timings(rid + "-p", room)
    nan = float("nan")
    ttft = (t_first - t0) * 1e3 if t_first else nan
    compute = nan if times["prefill_ms"] is None else times["prefill_ms"]
    end, written = times["prefill_end"], times["write_done"]
    # The WRITE is posted as soon as the forward ends (decode registered long before, during
    # the forward) and UCX may complete it inside the posting call: measure from the forward's end.
    transfer = (written - end) * 1e3 if end and written else nan
    return {
        "ttft_ms": ttft,
        "compute_ms": compute,
        "transfer_ms": transfer,
        "handoff_ms": ttft - compute - transfer,
        "dispatch_ms": (end - t0) * 1e3 - compute if end else nan,
        "after_write_ms": (t_first - written) * 1e3 if written and t_first else nan,
        "tokens": out,
        "finish": meta.get("finish_reason"),
        "prefill_finish": p["meta_info"]["finish_reason"],
    }


async def measure(args) -> tuple[dict, list[str]]:
    from components.engine.process.engine import CpuEngine

    capture = TimingCapture.install()
    agg = CpuEngine(model_path=args.model_path, skip_tokenizer_init=True, num_threads=1)
    decode = CpuEngine(
        model_path=args.model_path,
        skip_tokenizer_init=True,
        num_threads=1,
        disaggregation_mode="decode",
        kv_ucx_error_handling=args.ucx_error_handling,
    )
    prefill = None
    rng = random.Random(args.seed)
    runs: dict = {n: {"agg": [], "disagg": []} for n in args.lengths}
    problems: list[str] = []
    try:
        prefill = await EngineProcess.start(
            capture_timings=True,
            ready_timeout=120.0,
            model_path=args.model_path,
            skip_tokenizer_init=True,
            num_threads=1,
            disaggregation_mode="prefill",
            host="127.0.0.1",
            disaggregation_bootstrap_port=0,
            kv_ucx_error_handling=args.ucx_error_handling,
        )
        warm = [rng.randrange(3, agg.vocab_size) for _ in range(64)]
        await run_agg(agg, capture, warm)  # first requests pay allocation and UCX wire-up
        await run_disagg(decode, prefill, warm)
        for n in args.lengths:
            ids = [rng.randrange(3, agg.vocab_size) for _ in range(n)]
            for rep in range(args.runs):
                order = ("agg", "disagg") if rep % 2 == 0 else ("disagg", "agg")
                for arm in order:
                    row = (
                        await run_agg(agg, capture, ids)
                        if arm == "agg"
                        else await run_disagg(decode, prefill, ids)
                    )
                    runs[n][arm].append(row)
            problems += check(n, runs[n])
    finally:
        if prefill is not None:
            await prefill.close()
        agg.shutdown()
        decode.shutdown()
    return runs, problems


def check(n: int, by_arm: dict) -> list[str]:
    """Greedy: disaggregated tokens must equal aggregated ones; every request must finish."""
    out = []
    ref = by_arm["agg"][0]["tokens"]
    for arm, rows in by_arm.items():
        for row in rows:
            if (row["finish"] or {}).get("type") != "length":
                out.append(f"{arm} len={n}: finished with {row['finish']}")
            elif row["tokens"] != ref:
                out.append(f"{arm} len={n}: tokens differ from aggregated")
    return out


def kv_bytes_per_token(model_path: str) -> int:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 4  # fp32


def summarize(runs: dict, per_token: int) -> dict:
    out = {}
    for n, by_arm in runs.items():
        m = {
            arm: {k: median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], float)}
            for arm, rows in by_arm.items()
        }
        mib = n * per_token / 2**20
        m["kv_mib"] = mib
        m["transfer_gb_s"] = n * per_token / (m["disagg"]["transfer_ms"] * 1e-3) / 1e9
        m["delta_ms"] = m["disagg"]["ttft_ms"] - m["agg"]["ttft_ms"]
        m["ttft_ratio"] = m["disagg"]["ttft_ms"] / m["agg"]["ttft_ms"]
        out[n] = m
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(SMALL_MODEL))
    p.add_argument("--lengths", default="128,512,1024,2048,4096")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--ucx-error-handling", choices=("none", "peer"), default="none")
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    limit_cpu_threads(1)
    require_model(Path(args.model_path), "small")
    runs, problems = asyncio.run(measure(args))
    summary = summarize(runs, kv_bytes_per_token(args.model_path))
    headers, rows = split_rows(summary)
    print(
        f"\nTTFT, aggregated vs disaggregated, one request at a time, "
        f"median of {args.runs} runs (ms):"
    )
    print(format_table(headers, rows))
    print(
        "integrity: "
        + (
            "disaggregated tokens == aggregated tokens, all finished"
            if not problems
            else "; ".join(problems[:5])
        )
    )
    out = results_dir(args.out)
    for by_arm in runs.values():
        for rows_ in by_arm.values():
            for row in rows_:
                row.pop("tokens", None)
    write_json(
        out,
        "disagg_ttft",
        {
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "median": summary,
            "runs": runs,
            "problems": problems,
            "table": {"headers": headers, "rows": rows},
        },
    )
    plot_split(summary, out)
    print(f"wrote {out}/disagg_ttft.json and {out}/disagg_ttft.png")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
