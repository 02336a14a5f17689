"""The aiperf goals: this worker on `--engine sglang` against Dynamo 1.6.1's `python -m
dynamo.sglang` on the same engine, settings, model, frontend and load (bench_aiperf.json),
aggregated (agg-sglang against dynamo-sglang) and disaggregated (disagg-sglang against
dynamo-sglang-disagg), with what the same run measured about each goal not met."""

from __future__ import annotations

from typing import Any

from benchmarks.common import fmt
from benchmarks.goal import Goal, Load, num

# (what, ratio key in bench_aiperf.json, target, met?).
AIPERF_GOALS = (
    ("output tok/s", "output_tok_per_s", ">= 1.0x", lambda r: r >= 1.0),
    ("TTFT p50", "ttft_p50", "<= 1.0x", lambda r: r <= 1.0),
    ("worker CPU per output token", "worker_cpu_per_token", "<= 0.8x", lambda r: r <= 0.8),
)
PROCESS_TARGET = 0.8
# (arm, label, the reference arm its ratios must be taken against, its worker processes).
AIPERF_PAIRS = (("agg-sglang", "dynamo.sglang's", "dynamo-sglang", ("worker",)),
                ("disagg-sglang", "dynamo.sglang disagg's", "dynamo-sglang-disagg",
                 ("prefill", "decode")))


def _spread(ratios: dict[str, Any], key: str) -> str:
    lo_hi = (ratios.get("run_spread") or {}).get(key) or []
    if len(lo_hi) != 2:
        return ""
    return (f"run by run (each against the reference's run of the same repetition) this ratio "
            f"went from {fmt(lo_hi[0])}x to {fmt(lo_hi[1])}x")


def _engine_share(arm: dict[str, Any], ref: dict[str, Any]) -> str:
    share, ref_share = num(arm.get("engine_share")), num(ref.get("engine_share"))
    tree = num(arm.get("worker_cpu_us_per_token"))
    ref_tree = num(ref.get("worker_cpu_us_per_token"))
    if share != share or not ref_tree:
        return ""
    return (f"SGLang's scheduler and detokenizer processes (the same code in both arms; idle, its "
            f"disaggregated schedulers keep polling on SGLang's CPU path) spend {share:.0%} of "
            f"this arm's CPU ({ref_share:.0%} of the reference's): with its worker processes "
            f"costing nothing, this arm would still spend {fmt(tree * share / ref_tree)}x the "
            "reference's CPU per token")


def _bound(key: str, ratios: dict[str, Any], arm: dict[str, Any], ref: dict[str, Any]) -> str:
    parts = [_spread(ratios, key)]
    if key == "worker_cpu_per_token":
        procs = ratios.get("process_cpu_per_token") or {}
        parts.append(_engine_share(arm, ref))
        if procs:
            parts.append("the worker processes alone: " + ", ".join(
                f"{n} {fmt(v)}x" for n, v in sorted(procs.items())))
    return "; ".join(p for p in parts if p)


def aiperf_parity(load: Load) -> list[Goal]:
    data = load("bench_aiperf") or {}
    medians = data.get("median") or {}
    out = []
    for arm, ref, reference, processes in AIPERF_PAIRS:
        ratios = (data.get("ratios") or {}).get(arm) or {}
        # Results from before references were recorded are against dynamo-sglang.
        if ratios.get("reference", "dynamo-sglang") != reference:
            ratios = {}  # measured against another reference: decides nothing
        for what, key, target, check in AIPERF_GOALS:
            label = f"aiperf: {arm} {what} / {ref}"
            value = num(ratios.get(key)) if ratios else None
            if value is None:
                out.append(Goal(label, target))
                continue
            met = value == value and check(value)
            bound = "" if met else _bound(key, ratios, medians.get(arm, {}),
                                          medians.get(reference, {}))
            out.append(Goal(label, target, f"{fmt(value)}x", met, bound))
        per_request = _per_request_us(data, medians.get(arm, {}), medians.get(reference, {}),
                                      "prefill")
        out += _process_goals(arm, ref, processes, ratios, {"prefill": _prefill_handler(
            load("bench_prefill_handler"), per_request)})
    return out


def _per_request_us(data: dict[str, Any], arm: dict[str, Any], ref: dict[str, Any],
                    process: str) -> tuple[float, float] | None:
    """A worker process's CPU per request (us) in the arm and in the reference."""
    tokens = num((data.get("config") or {}).get("output_tokens"))
    ours = num((arm.get("process_cpu_us_per_token") or {}).get(process))
    theirs = num((ref.get("process_cpu_us_per_token") or {}).get(process))
    if None in (tokens, ours, theirs):
        return None
    return ours * tokens, theirs * tokens


def _prefill_handler(data: dict[str, Any] | None,
                     per_request: tuple[float, float] | None) -> str:
    """What bench_prefill_handler measured of the two prefill handlers alone, against the
    processes' difference per request."""
    med = (data or {}).get("median_us") or {}
    ours, theirs = num(med.get("this worker")), num(med.get("dynamo.sglang"))
    if ours is None or theirs is None:
        return ""
    parts = (data or {}).get("parts_us") or {}
    of_it = ", ".join(f"{what} {num(us):.0f} us" for what, us in parts.items())
    text = (f"the handlers alone (bench_prefill_handler: the same synthetic engine and legs) "
            f"spend {ours:.0f} us per request against dynamo.sglang's {theirs:.0f} us"
            + (f" (of this worker's: {of_it}; dynamo.sglang's does neither)" if of_it else ""))
    if per_request is not None:
        text += (f"; the whole processes spend {per_request[0]:.0f} and {per_request[1]:.0f} "
                 f"us per request: the handlers make {ours - theirs:.0f} us of the "
                 f"{per_request[0] - per_request[1]:.0f} us between them")
    return text


def _process_goals(arm: str, ref: str, processes: tuple[str, ...],
                   ratios: dict[str, Any], handlers: dict[str, str]) -> list[Goal]:
    """Each worker process alone (the Dynamo runtime, the handlers and SGLang's tokenizer
    manager; its scheduler and detokenizer processes are not in it); `handlers`: what a
    benchmark of a role's handlers alone says, by process name."""
    out = []
    per_process = ratios.get("process_cpu_per_token") or {}
    for name in processes:
        who = "worker" if name == "worker" else f"{name} worker"
        label = f"aiperf: {arm} {who} process's CPU per output token / {ref}"
        value = per_process.get(name)
        if value is None:
            out.append(Goal(label, f"<= {PROCESS_TARGET}x"))
            continue
        met = value == value and value <= PROCESS_TARGET
        bound = "" if met else "; ".join(p for p in (
            _spread(ratios, f"process:{name}"),
            "the process runs SGLang's tokenizer manager and Dynamo's bindings, the same code "
            "as the reference's, besides this worker's handlers", handlers.get(name, "")) if p)
        out.append(Goal(label, f"<= {PROCESS_TARGET}x", f"{fmt(value)}x", met, bound))
    return out
