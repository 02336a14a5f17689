"""Reading NVIDIA aiperf's JSON export (`profile_export_aiperf.json`, schema 1.4 in aiperf 0.13)
and the ratios of the aiperf benchmark: every arm against Dynamo 1.6.1's own `dynamo.sglang`.

aiperf computes the load's metrics itself (throughput over its measured phase, per-request TTFT,
per-request ITL = decode time / (output tokens - 1), percentiles); this module only picks them
out. Each metric in the export is `{"unit": ..., "avg": ..., "p50": ..., ...}`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import fmt, median, median_of_runs, ratio

EXPORT_NAME = "profile_export_aiperf.json"
REFERENCE = "dynamo-sglang"
DISAGG_REFERENCE = "dynamo-sglang-disagg"
REFERENCES = (REFERENCE, DISAGG_REFERENCE)
PERCENTILES = ("p50", "p90", "p99")
# Metric key in our dicts -> (aiperf metric, statistic).
PICKS = {
    "output_tok_per_s": ("output_token_throughput", "avg"),
    "req_per_s": ("request_throughput", "avg"),
    "completed": ("completed_request_count", "avg"),
    "output_tokens": ("total_output_tokens", "avg"),
    "error_rate_pct": ("request_error_rate", "avg"),
    **{f"ttft_{p}_ms": ("time_to_first_token", p) for p in PERCENTILES},
    **{f"itl_{p}_ms": ("inter_token_latency", p) for p in PERCENTILES},
}
# The table: (header, metric key).
COLUMNS = [
    ("req/s", "req_per_s"),
    ("out tok/s", "output_tok_per_s"),
    *((f"TTFT {p} ms", f"ttft_{p}_ms") for p in PERCENTILES),
    *((f"ITL {p} ms", f"itl_{p}_ms") for p in PERCENTILES),
    ("worker CPU us/tok", "worker_cpu_us_per_token"),
    ("of it worker processes", "worker_processes_cpu_us_per_token"),
]


def _wall(stamp: str) -> float:
    """aiperf writes its phase bounds as naive local ISO times; -> seconds since the epoch."""
    return datetime.fromisoformat(stamp).timestamp()


def parse_export(data: dict[str, Any]) -> dict[str, Any]:
    """One aiperf run's metrics (times in ms) and the wall-clock bounds of its measured phase."""
    out: dict[str, Any] = {}
    for key, (metric, stat) in PICKS.items():
        value = (data.get(metric) or {}).get(stat)
        out[key] = float("nan") if value is None else float(value)
    out["errors"] = len(data.get("error_summary") or [])
    out["complete"] = bool(data.get("is_complete")) and not data.get("was_cancelled")
    out["start_s"], out["end_s"] = _wall(data["start_time"]), _wall(data["end_time"])
    return out


def load_export(artifact_dir: Path) -> dict[str, Any]:
    return parse_export(json.loads((artifact_dir / EXPORT_NAME).read_text()))


def add_worker_cpu(metrics: dict[str, Any], cpu_s: float,
                   processes: dict[str, float]) -> dict[str, Any]:
    """The workers' process trees' CPU over the measured phase, per output token, and of it
    each worker process alone (`processes`: name -> CPU seconds; the rest of the trees is
    SGLang's scheduler and detokenizer processes on `--engine sglang`)."""
    tokens = metrics["output_tokens"]

    def per_token(seconds: float) -> float:
        return seconds * 1e6 / tokens if tokens else float("nan")

    metrics["worker_cpu_s"] = cpu_s
    metrics["worker_cpu_us_per_token"] = per_token(cpu_s)
    metrics["process_cpu_us_per_token"] = {n: per_token(s) for n, s in processes.items()}
    metrics["worker_processes_cpu_us_per_token"] = per_token(sum(processes.values()))
    metrics["engine_share"] = 1 - sum(processes.values()) / cpu_s if cpu_s > 0 else float("nan")
    return metrics


def reference_of(arm: str, measured: Any) -> str:
    """The arm an arm is compared with: 1.6.1's disaggregated pair for a disaggregated arm when
    it was measured, 1.6.1's aggregated worker otherwise."""
    if "disagg" in arm and DISAGG_REFERENCE in measured:
        return DISAGG_REFERENCE
    return REFERENCE


def arm_median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of an arm: every metric's median, each worker process's among them."""
    out = median_of_runs(runs)
    names = runs[0].get("process_cpu_us_per_token", {}) if runs else {}
    out["process_cpu_us_per_token"] = {
        n: median(r["process_cpu_us_per_token"][n] for r in runs) for n in names}
    return out


def run_spread(runs: list[dict[str, Any]], ref_runs: list[dict[str, Any]]) -> dict[str, list]:
    """[min, max] over repetitions of each run's ratio to the reference's run of the same
    repetition (the arms of a repetition ran back to back): how far noise moves a ratio."""
    out = {}
    for key, metric in (("output_tok_per_s", "output_tok_per_s"), ("ttft_p50", "ttft_p50_ms"),
                        ("worker_cpu_per_token", "worker_cpu_us_per_token")):
        values = [ratio(r[metric], b[metric]) for r, b in zip(runs, ref_runs)]
        out[key] = [min(values), max(values)] if values else []
    for name in (runs[0].get("process_cpu_us_per_token") or {}) if runs else ():
        values = [ratio(r["process_cpu_us_per_token"][name],
                        b.get("process_cpu_us_per_token", {}).get(name))
                  for r, b in zip(runs, ref_runs)]
        out[f"process:{name}"] = [min(values), max(values)] if values else []
    return out


def ratios_to_reference(medians: dict[str, dict[str, Any]],
                        runs: dict[str, list[dict[str, Any]]] | None = None
                        ) -> dict[str, dict[str, Any]]:
    """arm -> {reference, tok/s, TTFT p50, worker CPU per token, each worker process's CPU per
    token} as ratios to its reference's, and with `runs` the spread of those over repetitions."""
    runs = runs or {}
    out: dict[str, dict[str, Any]] = {}
    for arm, m in medians.items():
        ref = reference_of(arm, medians)
        base = medians.get(ref)
        if arm in REFERENCES or not base:
            continue
        out[arm] = {"reference": ref,
                    "output_tok_per_s": ratio(m["output_tok_per_s"], base["output_tok_per_s"]),
                    "ttft_p50": ratio(m["ttft_p50_ms"], base["ttft_p50_ms"]),
                    "worker_cpu_per_token": ratio(m["worker_cpu_us_per_token"],
                                                  base["worker_cpu_us_per_token"]),
                    "process_cpu_per_token": {
                        n: ratio(us, base.get("process_cpu_us_per_token", {}).get(n))
                        for n, us in m.get("process_cpu_us_per_token", {}).items()},
                    "run_spread": run_spread(runs.get(arm, []), runs.get(ref, []))}
    return out


def integrity_problems(runs: dict[str, list[dict[str, Any]]], requests: int) -> list[str]:
    problems = []
    for arm, rs in runs.items():
        for i, r in enumerate(rs):
            if not r["complete"] or r["errors"] or r["completed"] != requests:
                problems.append(f"{arm} run {i}: {r['completed']:.0f}/{requests} completed, "
                                f"{r['errors']} error kinds")
    return problems


def headline(data: dict[str, Any]) -> list[str]:
    """The docs page's lines under the table: the ratios, integrity and the exact commands."""
    lines = [f"{arm} / {r.get('reference', REFERENCE)}: output tok/s "
             f"**{fmt(r['output_tok_per_s'])}x**, TTFT p50 **{fmt(r['ttft_p50'])}x**, "
             "worker CPU per output token "
             f"**{fmt(r['worker_cpu_per_token'])}x**"
             for arm, r in (data.get("ratios") or {}).items()]
    problems = data.get("integrity_problems") or []
    lines.append("integrity (every request completed, no errors): "
                 + ("**OK**" if not problems else "; ".join(problems)))
    lines.append(f"benchmark: `{data.get('command', '?')}`; each aiperf run: "
                 f"`{data.get('aiperf_command', '?')}`")
    return lines


def workload(data: dict[str, Any]) -> str:
    cfg = data.get("config") or {}
    load = (data.get("machine") or {}).get("loadavg_1m_at_start", "?")
    during = [r["loadavg_1m"] for rs in (data.get("runs") or {}).values() for r in rs
              if r.get("loadavg_1m") is not None]
    peak = f", up to {fmt(max(during), 1)} after its aiperf runs" if during else ""
    return (f"; model `{Path(cfg.get('model_path', '?')).name}`, {cfg.get('input_tokens')} in / "
            f"{cfg.get('output_tokens')} out tokens, concurrency {cfg.get('concurrency')}, "
            f"{cfg.get('requests')} requests per run, load average {load} at start{peak}")


def table(medians: dict[str, dict[str, Any]], ratios: dict[str, dict[str, float]]
          ) -> tuple[list[str], list[list]]:
    headers = ["arm", *(h for h, _ in COLUMNS), "ref", "tok/s / ref", "TTFT p50 / ref",
               "CPU/tok / ref"]
    rows = []
    for arm, m in medians.items():
        r = ratios.get(arm, {})
        rows.append([arm, *(m.get(k) for _, k in COLUMNS), r.get("reference", "-"),
                     *(r.get(k, 1.0 if arm in REFERENCES else float("nan"))
                       for k in ("output_tok_per_s", "ttft_p50", "worker_cpu_per_token"))])
    return headers, rows
