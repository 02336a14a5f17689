"""The serving-path goals, each checked against the JSON of one `make bench` run: the figure
measured, whether it meets the goal and, where it does not, what bounds it on this machine,
measured in the same run (benchmarks/summary.py puts the table at the top of the page)."""

from __future__ import annotations

from typing import Optional

from benchmarks.aiperf_goals import aiperf_parity
from benchmarks.aiperf_peer_goals import peer_goals
from benchmarks.common import fmt, median
from benchmarks.goal import Goal, Load, num


def tokenizer_workers(load: Load) -> list[Goal]:
    what = "tokenizer workers: loop lag during a 64k-token chat, N=2"
    data = load("tokenizer_workers")
    if data is None:
        return [Goal(what, "max <= 2 ms")]
    n1, n2 = data["median"]["N=1"], data["median"]["N=2"]
    busy, other, idle = (num(n2[k]) for k in ("lag_busy_ms", "lag_other_ms", "lag_idle_loop_ms"))
    calm = num(n2.get("lag_streams_only_ms"))
    worst = max(busy, other)
    bound = (f"with the four short streams alone, before the chat, the workers' loops already lag "
             f"<= {fmt(calm, 0)} ms: serving those streams (the engine thread and the runtime's "
             "threads share the process's GIL with its loop) is what holds them, tokenizing or "
             f"not; an idle loop in a process of its own lags {fmt(idle, 1)} ms over the chat's "
             "window (the workers' figures are histogram buckets: 2, 5, 10 ms)")
    return [Goal(what, "max <= 2 ms",
                 f"<= {fmt(busy, 0)} ms in the process tokenizing it, <= {fmt(other, 0)} ms in "
                 f"the other (N=1: <= {fmt(num(n1['lag_busy_ms']), 0)} ms)",
                 worst <= 2.0, "" if worst <= 2.0 else bound),
            Goal("tokenizer workers: Text-mode tok/s at concurrency 16", "N=2 vs N=1",
                 f"{fmt(data['speedup'])}x", None)]


def token_cpu(load: Load) -> list[Goal]:
    data = load("token_cpu")
    s = (data or {}).get("summaries") or {}
    agg, eng, mock, floor = (s.get(k) for k in ("agg", "engine", "mocker", "floor"))
    return [_cpu_goal(agg, mock, floor, s.get("agg-interval2")), _tput_goal(agg, eng),
            _ttft_goal(agg, eng, floor)]


def _cpu_goal(agg: Optional[dict], mock: Optional[dict], floor: Optional[dict],
              interval: Optional[dict]) -> Goal:
    what = "worker CPU per token outside the engine thread / the mocker's"
    if not agg or not mock:
        return Goal(what, "<= 2x")
    ours, ref = agg["us_per_token"]["worker_outside_engine"], mock["us_per_token"]["mocker"]
    base = floor["us_per_token"]["floor"] if floor else float("nan")
    cpu = ours / ref
    bound = (f"a Python worker that only streams costs {fmt(base, 0)} us per token, "
             f"{fmt(base / ref)}x the mocker: Dynamo's Python bindings cost that per streamed "
             "item, before any engine or handler work")
    if interval:
        fewer = interval["us_per_token"]["worker_outside_engine"]
        bound += (f"; with `--stream-interval 2` (half the items) the worker spends "
                  f"{fmt(fewer, 0)} us, {fmt(fewer / ref)}x the mocker")
    return Goal(what, "<= 2x", f"{fmt(cpu)}x ({fmt(ours, 0)} vs {fmt(ref, 0)} us)", cpu <= 2.0,
                bound if cpu > 2.0 else "")


def _tput_goal(agg: Optional[dict], eng: Optional[dict]) -> Goal:
    what = "aggregated tok/s / the engine's in-process, tiny, concurrency 16"
    if not agg or not eng:
        return Goal(what, ">= 0.85x")
    whole = agg["us_per_token"]["agg"]
    tput = agg["metrics"]["output_tok_per_s"] / eng["metrics"]["output_tok_per_s"]
    return Goal(what, ">= 0.85x", f"{fmt(tput)}x", tput >= 0.85,
                f"the worker's threads share one GIL and spend {fmt(whole, 0)} us per token in "
                f"all (engine thread {fmt(agg['us_per_token'].get('agg.engine'), 0)}): at most "
                f"{fmt(1e6 / whole, 0)} tok/s, against the engine's "
                f"{fmt(eng['metrics']['output_tok_per_s'], 0)} in-process" if tput < 0.85 else "")


def _ttft_goal(agg: Optional[dict], eng: Optional[dict], floor: Optional[dict]) -> Goal:
    what = "aggregated TTFT p50 over the engine's, concurrency 1"
    if not agg or not eng:
        return Goal(what, "<= 5 ms")
    ttft = agg["metrics"]["ttft_c1_p50_ms"] - eng["metrics"]["ttft_c1_p50_ms"]
    floor_ttft = floor["metrics"]["ttft_c1_p50_ms"] if floor else float("nan")
    return Goal(what, "<= 5 ms", f"{fmt(ttft, 1)} ms", ttft <= 5.0,
                "" if ttft <= 5.0 else f"a Python worker that answers its first token at once "
                f"(the floor arm) has a TTFT p50 of {fmt(floor_ttft, 1)} ms through the same "
                "frontend: HTTP, the chat template and tokenization, the request plane and the "
                "bindings, with no engine at all")


def chunked_prefill(load: Load) -> list[Goal]:
    what = "chunked prefill: aggregated ITL p99 / p50 at concurrency 16"
    data = load("serving")
    ratios = (data or {}).get("ratios") or {}
    chunked, plain = ratios.get("agg-chunked", {}).get("16"), ratios.get("agg", {}).get("16")
    if not chunked or not plain:
        return [Goal(what, "<= 4"), Goal("chunked prefill: tok/s vs without", ">= 1.0x")]
    itl = num(chunked.get("itl_p99_over_p50"))
    tput = chunked["throughput_vs_engine"] / plain["throughput_vs_engine"]
    return [Goal(what, "<= 4", f"{fmt(itl, 1)} (without chunking "
                 f"{fmt(num(plain.get('itl_p99_over_p50')), 1)})", itl <= 4.0),
            Goal("chunked prefill: tok/s vs without", ">= 1.0x", f"{fmt(tput)}x", tput >= 1.0,
                 "" if tput >= 1.0 else "a prompt prefilled in 256-token chunks runs more "
                 "forward passes (each with the decode rows) than one whole-prompt pass")]


ENGINE_ARM = "head:1g"  # bench_kv_transfer's arm of the engine's pool layout and cma segment


def _beside_copy_ms(row: dict) -> float:
    """A WRITE's time not spent in the kernel copy of its bytes (one call)."""
    return row["nixl_ms"] - row["mib"] * 2**20 / row["kernel_gbs"] / 1e6


def kv_transfer(load: Load) -> list[Goal]:
    data, ttft = load("bench_kv_transfer"), load("disagg_ttft")
    goals = [Goal("NIXL KV WRITE / same-process copy, >= 8 MiB", ">= 0.9x")]
    if data is not None:
        # The engine's arm (results from before arms were named had only the one).
        big = [r for r in data["rows"] if r["mib"] >= 8 and r.get("arm", ENGINE_ARM) == ENGINE_ARM]
        one = [r for r in data["rows"] if r["mib"] >= 8 and r.get("layout") == "token"]
        worst = min(r["nixl_vs_copy"] for r in big)
        bound = ("the kernel's cross-process copy UCX `cma` makes (`process_vm_writev`) reaches "
                 + ", ".join(fmt(r["kernel_vs_copy"]) for r in big) + "x the copy in one call, "
                 + ", ".join(fmt(r.get("kernel_runs_vs_copy")) for r in big) + "x in one call "
                 "per descriptor (64 per room in this layout); a one-descriptor (token-major) "
                 "pool reaches " + (", ".join(fmt(r["nixl_vs_copy"]) for r in one) or "-")
                 + "x, spending " + (", ".join(fmt(_beside_copy_ms(r)) for r in one) or "-")
                 + " ms per WRITE besides that one-call copy")
        goals[0] = Goal(goals[0].what, ">= 0.9x",
                        ", ".join(f"{fmt(r['nixl_vs_copy'])}x at {r['mib']:g} MiB" for r in big),
                        worst >= 0.9, "" if worst >= 0.9 else bound)
    what = "disaggregated hand-off after the KV WRITE"
    if ttft is None:
        return goals + [Goal(what, "<= 1 ms")]
    after = [m["disagg"]["after_write_ms"] for m in ttft["median"].values()]
    median_after = median(after)
    met = median_after <= 1.0
    return goals + [Goal(what, "<= 1 ms", f"{fmt(median_after, 1)} ms median over the prompt "
                         f"sizes ({fmt(min(after), 1)}-{fmt(max(after), 1)})", met,
                         "" if met else "the decode engine thread's wake-up on the WRITE's "
                         "notification and its hand-off of the first token to the event loop")]


def vs_transformers(load: Load) -> list[Goal]:
    what = "the engine / transformers' continuous batching, batch 16"
    data = load("vs_transformers")
    if data is None:
        return [Goal(what, ">= 2x")]
    return [Goal(what, ">= 2x", f"{fmt(data['ratio'])}x", data["ratio"] >= 2.0)]


def idle_cpu(load: Load) -> list[Goal]:
    what = "idle worker process (CPU engine, aggregated)"
    data = load("idle_cpu")
    if data is None or "cpu" not in data["arms"]:
        return [Goal(what, "<= 0.002 cores")]
    cores = data["arms"]["cpu"]["worker_cores"]
    return [Goal(what, "<= 0.002 cores", f"{cores:.4f} cores", cores <= data["goal_worker_cores"])]


def all_goals(load: Load) -> list[Goal]:
    return [*tokenizer_workers(load), *token_cpu(load), *idle_cpu(load), *chunked_prefill(load),
            *kv_transfer(load), *vs_transformers(load), *aiperf_parity(load),
            *peer_goals(load)]


def render(load: Load) -> str:
    goals = all_goals(load)
    rows = [f"| {g.what} | {g.goal} | {g.measured} | "
            f"{'-' if g.met is None else ('yes' if g.met else '**no**')} |" for g in goals]
    bounds = [f"- {g.what}: {g.bound}" for g in goals if g.met is False and g.bound]
    text = ("| goal | target | this run | met |\n|------|--------|----------|-----|\n"
            + "\n".join(rows) + "\n")
    if bounds:
        text += "\nWhat bounds the goals not met, measured in the same run:\n\n" + "\n".join(bounds)
    return text + "\n"
