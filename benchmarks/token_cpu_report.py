"""bench_token_cpu's table, goal lines and JSON payload, from its per-run measurements."""

from __future__ import annotations

import argparse

from benchmarks.common import fmt, format_table, median, median_of_runs

# The arm's worker process that serves the frontend, and the other worker (disagg's prefill).
WORKER = {"agg": "agg", "agg-separate": "agg", "agg-interval2": "agg", "disagg": "decode",
          "mocker": "mocker", "floor": "floor"}
HEADERS = ["arm", "tok/s", "x engine", "tok/chunk", "TTFT c=1 p50 ms", "+ms vs engine", "frontend",
           "worker loop", "worker bridge", "worker outside engine", "engine thread",
           "prefill worker", "client"]


def us_per_token(run: dict) -> dict[str, float]:
    """One run's CPU per output token (us) by `process.group` and by process."""
    tokens = run["tokens"] or float("nan")
    out: dict[str, float] = {}
    for proc, groups in run["cpu_s"].items():
        for group, sec in groups.items():
            out[f"{proc}.{group}"] = sec * 1e6 / tokens
        out[proc] = sum(groups.values()) * 1e6 / tokens
    return out


def arm_summary(name: str, runs: list[dict]) -> dict:
    per_run = [us_per_token(r) for r in runs]
    keys = sorted({k for r in per_run for k in r})
    us = {k: median(r.get(k, 0.0) for r in per_run) for k in keys}
    worker = WORKER.get(name)
    if worker is not None:
        us["worker_outside_engine"] = us.get(worker, 0.0) - us.get(f"{worker}.engine", 0.0)
    flat = [{k: v for k, v in r.items() if not k.startswith("cpu_s")} for r in runs]
    return {"metrics": median_of_runs(flat), "us_per_token": us}


def row(name: str, s: dict, engine: dict | None) -> list:
    m, us, worker = s["metrics"], s["us_per_token"], WORKER.get(name)
    base_tok = engine["metrics"]["output_tok_per_s"] if engine else float("nan")
    base_ttft = engine["metrics"]["ttft_c1_p50_ms"] if engine else float("nan")
    dash = float("nan")
    return [name, m["output_tok_per_s"], m["output_tok_per_s"] / base_tok, m["tokens_per_chunk"],
            m["ttft_c1_p50_ms"], m["ttft_c1_p50_ms"] - base_ttft,
            us.get("frontend", dash),
            us.get(f"{worker}.loop", dash) if name != "mocker" else dash,
            us.get(f"{worker}.bridge", dash) if name != "mocker" else dash,
            us.get("worker_outside_engine", dash),
            # --cpu-engine-process separate: the engine's whole process
            us.get(f"{worker}.engine", us.get(f"{worker}-engine", dash)),
            us.get("prefill", dash), us.get("client", dash)]


def goals(summaries: dict) -> list[str]:
    agg, eng, mock = (summaries.get(k) for k in ("agg", "engine", "mocker"))
    lines = []
    if agg and mock:
        ours, ref = agg["us_per_token"]["worker_outside_engine"], mock["us_per_token"]["mocker"]
        lines.append(f"agg worker's CPU per token outside its engine thread / the mocker's whole "
                     f"process: **{fmt(ours / ref)}x** ({fmt(ours, 0)} vs {fmt(ref, 0)} us; goal "
                     f"<= 2x; mocker at {fmt(mock['metrics']['output_tok_per_s'], 0)} tok/s, agg "
                     f"at {fmt(agg['metrics']['output_tok_per_s'], 0)})")
        lines.append(f"frontend CPU per token, agg / mocker: "
                     f"{fmt(agg['us_per_token']['frontend'] / mock['us_per_token']['frontend'])}x")
    floor = summaries.get("floor")
    if agg and floor:
        ours, base = agg["us_per_token"]["worker_outside_engine"], floor["us_per_token"]["floor"]
        line = (f"a Python worker that only streams (the floor of Dynamo's Python bindings): "
                f"{fmt(base, 0)} us per token (loop {fmt(floor['us_per_token'].get('floor.loop'), 0)}"
                f", bridge {fmt(floor['us_per_token'].get('floor.bridge'), 0)}) at "
                f"{fmt(floor['metrics']['output_tok_per_s'], 0)} tok/s; agg's worker outside its "
                f"engine thread is **{fmt(ours / base)}x** that floor")
        if mock:
            line += f"; the floor alone is {fmt(base / mock['us_per_token']['mocker'])}x the mocker"
        lines.append(line)
    if agg:
        whole = agg["us_per_token"]["agg"]
        lines.append(f"agg worker process, all threads: {fmt(whole, 0)} us per token; its Python "
                     f"threads share one GIL, so it serves at most about {fmt(1e6 / whole, 0)} "
                     f"tok/s (engine thread {fmt(agg['us_per_token'].get('agg.engine'), 0)} us "
                     "of it)")
    if agg and eng:
        am, em = agg["metrics"], eng["metrics"]
        lines.append(f"agg tok/s at concurrency {int(am['concurrency'])} / the engine's "
                     f"in-process: **{fmt(am['output_tok_per_s'] / em['output_tok_per_s'])}x** "
                     f"(goal >= 0.85)")
        lines.append(f"agg TTFT p50 at concurrency 1 over the engine's: "
                     f"**{fmt(am['ttft_c1_p50_ms'] - em['ttft_c1_p50_ms'], 1)} ms** (goal <= 5)")
    return lines


def report(args: argparse.Namespace, runs: dict) -> dict:
    for by_arm in runs.values():
        for r in by_arm:
            r["concurrency"] = args.concurrency
    summaries = {name: arm_summary(name, r) for name, r in runs.items()}
    engine = summaries.get("engine")
    rows = [row(name, s, engine) for name, s in summaries.items()]
    problems = [f"{name}: {k}={s['metrics'][k]:g}" for name, s in summaries.items()
                for k in ("failed", "short_output", "usage_mismatch") if s["metrics"].get(k)]
    print(f"\nCPU us per output token, concurrency {args.concurrency}, output {args.output_len}, "
          f"median of {args.runs} runs:")
    print(format_table(HEADERS, rows))
    lines = goals(summaries)
    print("\n".join(f"- {line}" for line in lines))
    print("integrity: " + ("OK" if not problems else "; ".join(problems)))
    return {"config": {k: v for k, v in vars(args).items() if k != "out"},
            "summaries": summaries, "runs": runs,
            "table": {"headers": HEADERS, "rows": rows}, "goals": lines,
            "integrity_problems": problems}
