"""Table and stacked-bar plot for bench_disagg_ttft."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import new_figure, save_figure


def split_rows(summary: dict) -> tuple[list[str], list[list]]:
    headers = [
        "prompt",
        "KV MiB",
        "agg TTFT",
        "disagg TTFT",
        "delta",
        "disagg / agg",
        "compute (agg)",
        "compute (P)",
        "transfer",
        "GB/s",
        "hand-off",
        "of which after WRITE",
    ]
    rows = []
    for n, m in summary.items():
        a, d = m["agg"], m["disagg"]
        rows.append(
            [
                n,
                m["kv_mib"],
                a["ttft_ms"],
                d["ttft_ms"],
                m["delta_ms"],
                m["ttft_ratio"],
                a["compute_ms"],
                d["compute_ms"],
                d["transfer_ms"],
                m["transfer_gb_s"],
                d["handoff_ms"],
                d["after_write_ms"],
            ]
        )
    return headers, rows


def plot_split(summary: dict, out_dir: Path) -> Path:
    """Left: each TTFT as % of the aggregated TTFT, stacked by part. Right: the parts in ms."""
    fig, axes = new_figure(ncols=2, width=4.8, height=3.6)
    lengths = list(summary)
    x, w = range(len(lengths)), 0.38
    agg = [summary[n]["agg"] for n in lengths]
    dis = [summary[n]["disagg"] for n in lengths]
    pct = [100.0 / a["ttft_ms"] for a in agg]
    ax = axes[0]
    _stack(
        ax,
        [i - w / 2 for i in x],
        w,
        [
            ([a["compute_ms"] * p for a, p in zip(agg, pct)], "#1f77b4", "prefill compute"),
            ([a["other_ms"] * p for a, p in zip(agg, pct)], "#aec7e8", "agg: rest"),
        ],
    )
    _stack(
        ax,
        [i + w / 2 for i in x],
        w,
        [
            ([d["compute_ms"] * p for d, p in zip(dis, pct)], "#1f77b4", None),
            ([d["transfer_ms"] * p for d, p in zip(dis, pct)], "#d62728", "KV transfer"),
            ([d["handoff_ms"] * p for d, p in zip(dis, pct)], "#ff9896", "disagg: hand-off"),
        ],
    )
    ax.axhline(100, color="#555", lw=0.8, ls=":")
    ax.set_xticks(list(x), [str(n) for n in lengths])
    ax.set_xlabel("prompt tokens (left: agg, right: disagg)")
    ax.set_ylabel("% of aggregated TTFT")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("TTFT split", fontsize=10)
    ax = axes[1]
    for key, color, label, marker in (
        ("transfer_ms", "#d62728", "KV transfer", "s"),
        ("handoff_ms", "#ff9896", "hand-off", "^"),
    ):
        ax.plot(lengths, [d[key] for d in dis], marker=marker, color=color, label=label)
    ax.plot(
        lengths,
        [summary[n]["delta_ms"] for n in lengths],
        marker="o",
        color="#333",
        label="disagg - agg TTFT",
    )
    ax.axhline(0, color="#555", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("what disaggregation adds (ms)", fontsize=10)
    fig.suptitle(
        "Disaggregated vs aggregated TTFT, small model, one request at a time", fontsize=11
    )
    return save_figure(fig, out_dir, "disagg_ttft")


def _stack(ax, xs, width, parts) -> None:
    bottom = [0.0] * len(xs)
    for values, color, label in parts:
        ax.bar(xs, values, width, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
