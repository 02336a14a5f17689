"""Table rows and the plot of the serving benchmark (kept apart from the measuring code)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import new_figure, ratio, save_figure

COLORS = {"engine": "#7f7f7f", "agg": "#1f77b4", "agg-separate": "#9467bd",
          "agg-chunked": "#2ca02c", "disagg": "#d62728", "disagg-decode": "#ff7f0e"}
LABELS = {"engine": "engine in-process", "agg": "Dynamo agg",
          "agg-separate": "Dynamo agg, engine process",
          "agg-chunked": "Dynamo agg, chunked prefill", "disagg": "Dynamo disagg (NIXL)",
          "disagg-decode": "Dynamo disagg, decode-orchestrated"}
ARM_ORDER = tuple(LABELS)


# The latency and throughput columns both tables share: (header, metric key).
METRICS = [
    ("req/s", "req_per_s"),
    ("out tok/s", "output_tok_per_s"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("TTFT p99 ms", "ttft_p99_ms"),
    ("ITL p50 ms", "itl_p50_ms"),
    ("ITL p99 ms", "itl_p99_ms"),
]


def _metrics(m: dict) -> list:
    return [m[key] for _, key in METRICS]


def serving_rows(medians: dict, concurrency: list[int]) -> tuple[list[str], list[list]]:
    headers = ["conc", "arm", *(h for h, _ in METRICS), "TPOT ms", "tput / engine",
               "TTFT - engine ms"]
    base = medians.get("engine")
    rows = []
    for c in concurrency:
        for name in ARM_ORDER:
            if name not in medians:
                continue
            m = medians[name][c]
            vs = base[c] if base else None
            rows.append([
                c,
                name,
                *_metrics(m),
                m["tpot_mean_ms"],
                ratio(m["output_tok_per_s"], vs["output_tok_per_s"]) if vs else float("nan"),
                m["ttft_p50_ms"] - vs["ttft_p50_ms"] if vs else float("nan"),
            ])
    return headers, rows


def open_loop_table(open_loop: dict) -> dict:
    base = open_loop.get("engine")
    headers = ["arm", *(h for h, _ in METRICS), "TTFT p50 - engine ms"]
    rows = [
        [n, *_metrics(m), m["ttft_p50_ms"] - base["ttft_p50_ms"] if base else float("nan")]
        for n, m in open_loop.items()
    ]
    return {"headers": headers, "rows": rows}


def plot_serving(
    medians: dict,
    concurrency: list[int],
    out_dir: Path,
    name: str = "serving",
    model: str = "small",
) -> Path:
    panels = [
        ("output_tok_per_s", "output tokens/s"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("itl_p50_ms", "ITL p50 (ms)"),
        ("itl_p99_ms", "ITL p99 (ms)"),
    ]
    fig, axes = new_figure(ncols=len(panels), width=3.6, height=3.4)
    for ax, (key, label) in zip(axes, panels):
        for arm, by_c in medians.items():
            ax.plot(
                concurrency,
                [by_c[c][key] for c in concurrency],
                marker="o",
                color=COLORS.get(arm),
                label=LABELS.get(arm, arm),
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrency, [str(c) for c in concurrency])
        ax.set_xlabel("concurrency (closed loop)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Serving: {model} model on the CPU engine (median of runs)", fontsize=11)
    return save_figure(fig, out_dir, name)


def ratios(medians: dict, concurrency: list[int]) -> dict:
    out: dict = {}
    base = medians.get("engine")
    for name in ARM_ORDER[1:]:
        if name not in medians:
            continue
        for c in concurrency:
            m = medians[name][c]
            entry = out.setdefault(name, {}).setdefault(c, {})
            entry["itl_p99_over_p50"] = ratio(m["itl_p99_ms"], m["itl_p50_ms"])
            if base:
                entry["throughput_vs_engine"] = ratio(
                    m["output_tok_per_s"], base[c]["output_tok_per_s"]
                )
                entry["ttft_overhead_ms_vs_engine"] = m["ttft_p50_ms"] - base[c]["ttft_p50_ms"]
            if name != "agg" and "agg" in medians:
                entry["throughput_vs_agg"] = ratio(
                    m["output_tok_per_s"], medians["agg"][c]["output_tok_per_s"]
                )
                entry["ttft_delta_ms_vs_agg"] = m["ttft_p50_ms"] - medians["agg"][c]["ttft_p50_ms"]
    return out


def integrity_problems(runs: dict) -> list[str]:
    problems = []
    for name, by_c in runs.items():
        for c, rs in by_c.items():
            for key in ("failed", "usage_mismatch", "short_output", "prompt_len_mismatch"):
                total = sum(r[key] for r in rs)
                if total:
                    errs = sorted({e for r in rs for e in r["errors"]})[:2]
                    problems.append(f"{name} c={c}: {total} {key} {errs if errs else ''}".strip())
    return problems
