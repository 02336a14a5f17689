"""Render the benchmarks' JSON results as Markdown: results/summary.md, or the docs page.

    python -m benchmarks.summary [--out results]                  # -> stdout
    python -m benchmarks.summary --docs docs/benchmarks.md        # page reading docs/bench/*.json

The tables and ratio lines are generated from the JSON, so the page always matches the numbers;
the prose (what each benchmark does, how to read it) is in benchmarks/page_text.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import aiperf_report, goals
from benchmarks.kv_transfer_report import kv_transfer_lines
from benchmarks.common import REPO_ROOT, fmt, format_table, results_dir
from benchmarks.page_text import FOOTER, INTRO, SECTIONS


def load(out: Path, name: str) -> dict | None:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def table_of(name: str, data: dict) -> str:
    if "table" in data:
        text = format_table(data["table"]["headers"], data["table"]["rows"])
        if data.get("open_loop_table"):
            cfg = data.get("config") or {}
            text += (
                f"\n\nOpen loop, Poisson arrivals at {cfg.get('request_rate')} req/s, "
                f"{cfg.get('open_loop_requests')} requests:\n\n"
                + format_table(data["open_loop_table"]["headers"], data["open_loop_table"]["rows"])
            )
        return text
    if name == "bench_kv_transfer":
        headers = ["layout:cma segment", "prompt tokens", "KV MiB", "descriptors", "NIXL ms",
                   "NIXL GB/s", "copy_ ms", "copy_ GB/s", "NIXL / copy_", "paired",
                   "kernel copy GB/s", "NIXL / kernel copy", "kernel copy per run ms",
                   "NIXL / kernel copy per run"]
        keys = ["arm", "tokens", "mib", "descriptors", "nixl_ms", "nixl_gbs", "copy_ms",
                "copy_gbs", "nixl_vs_copy", "nixl_vs_copy_paired", "kernel_gbs",
                "nixl_vs_kernel", "kernel_runs_ms", "nixl_vs_kernel_runs"]
        return format_table(headers, [[r.get(k) for k in keys] for r in data["rows"]])
    if name == "bench_engine":
        rows = [[f"prefill {n} tokens", "tok/s", v] for n, v in data["prefill"].items()]
        rows += [[f"decode batch {b}", "tok/s", v] for b, v in data["decode"].items()]
        rows += [
            [f"loop lag {k} during a 2,000-token prefill", "ms", v]
            for k, v in data["loop_lag_ms"].items()
        ]
        return format_table(["measure", "unit", "value"], rows)
    if name == "vs_transformers":
        return format_table(["arm", "output tok/s"], [[k, v] for k, v in data["tok_s"].items()])
    return "(no table)"


def headline(name: str, data: dict) -> list[str]:
    """The result as ratios against the baseline measured in the same run."""
    if name.startswith("serving"):
        lines = []
        for arm, by_c in (data.get("ratios") or {}).items():
            for c, r in by_c.items():
                bits = [f"ITL p99 / p50 {fmt(r.get('itl_p99_over_p50'), 1)}"]
                if r.get("throughput_vs_engine") is not None:  # runs without an engine arm
                    bits[:0] = [
                        f"output tok/s **{fmt(r['throughput_vs_engine'])}x** the engine's",
                        f"TTFT p50 {fmt(r.get('ttft_overhead_ms_vs_engine'), 1)} ms over it"]
                if "throughput_vs_agg" in r:
                    bits.append(
                        f"{fmt(r['throughput_vs_agg'])}x agg's tok/s, TTFT p50 "
                        f"{fmt(r['ttft_delta_ms_vs_agg'], 1)} ms vs agg"
                    )
                lines.append(f"{arm}, concurrency {c}: " + "; ".join(bits))
        problems = data.get("integrity_problems") or []
        lines.append(
            "integrity (tokens received == usage.completion_tokens == max_tokens, prompt "
            "tokens == client-side count, no failed request): "
            + ("**OK**" if not problems else "; ".join(problems))
        )
        return lines
    if name == "token_cpu":
        return list(data.get("goals") or [])
    if name == "stream_overhead":
        m, drift = data.get("marginal_us_per_chunk") or {}, data.get("ratio_drift") or {}
        return [
            "marginal cost per chunk (slope between the sizes, µs): "
            + ", ".join(f"{k} {fmt(v)}" for k, v in m.items()),
            "handler / direct throughput ratio at the largest N divided by the same at the "
            "smallest N (1.0 = constant per-chunk cost): "
            + ", ".join(f"{k} **{fmt(v)}**" for k, v in drift.items()),
        ]
    if name == "preprocess_loop":
        r = data["ratios"]
        return [
            f"max loop lag, inline / executor: **{fmt(r['max_lag_inline_over_executor'], 1)}x**",
            f"max gap of the concurrent stream, inline / executor: "
            f"**{fmt(r['max_gap_inline_over_executor'], 1)}x**",
            f"max loop-side tokenizer call, shared backend / executor: "
            f"**{fmt(r['max_probe_shared_over_executor'], 1)}x**",
            "token ids identical in all arms: "
            + ("yes" if data.get("ids_identical") else "**NO**"),
        ]
    if name == "bench_kv_transfer":
        return kv_transfer_lines(data)
    if name == "disagg_ttft":
        lines = [
            f"{n} tokens: disaggregated TTFT **{fmt(m['ttft_ratio'])}x** aggregated "
            f"({fmt(m['delta_ms'], 1)} ms; KV transfer {fmt(m['disagg']['transfer_ms'], 1)} ms, "
            f"hand-off {fmt(m['disagg']['handoff_ms'], 1)} ms)"
            for n, m in data["median"].items()
        ]
        problems = data.get("problems") or []
        lines.append(
            "integrity (greedy disaggregated tokens == aggregated tokens): "
            + ("**OK**" if not problems else "; ".join(problems[:3]))
        )
        return lines
    if name == "bench_engine":
        dec = {int(k): v for k, v in data["decode"].items()}
        if len(dec) >= 2:
            lo, hi = min(dec), max(dec)
            return [
                f"continuous batching: decode at batch {hi} gives **{fmt(dec[hi] / dec[lo])}x** "
                f"the tokens/s of batch {lo}"
            ]
    if name == "bench_constrained":
        return [
            f"JSON schema / unconstrained: **{fmt(data['ratio'], 3)}x** decode tok/s at batch "
            f"{data['batch']}; a cold schema compile waits {fmt(data['compile_ms'], 1)} ms"
        ]
    if name == "vs_transformers":
        return [
            f"the engine / transformers' continuous batching (`generate_batch`): "
            f"**{fmt(data['ratio'])}x** output tok/s at batch {data['config']['batch']}; greedy "
            "tokens identical: " + ("yes" if data.get("tokens_identical") else "no")
        ]
    if name == "tokenizer_workers":
        med = data["median"]
        return [f"N=2 / N=1: **{fmt(data['speedup'])}x** Text-mode tok/s at concurrency 16; "
                f"largest token gap during the 64k chat {fmt(med['N=1']['max_gap_ms'], 0)} ms "
                f"(N=1) vs {fmt(med['N=2']['max_gap_ms'], 0)} ms (N=2)"]
    if name.startswith("bench_kv_routing") and "repeat_mean_ttft_saved_ms" in data:
        res = data["result"]
        return [f"repeated-prefix TTFT mean, round-robin / kv: "
                f"**{fmt(res['round-robin']['repeat_mean_ms'] / res['kv']['repeat_mean_ms'])}x** "
                f"({fmt(data['repeat_mean_ttft_saved_ms'], 0)} ms saved per request)"]
    if name == "bench_logprobs":
        return [f"with top-{data['top_logprobs_num']} logprobs / without: "
                f"**{fmt(data['ratio'], 3)}x** decode tok/s at batch {data['batch']}"]
    if name == "bench_aiperf":
        return aiperf_report.headline(data)
    if name == "bench_choices":
        return [
            f"one request with n={data['config']['n']} / {data['config']['n']} single requests: "
            f"**{fmt(data['speedup'])}x** faster; tokens identical: "
            + ("yes" if data.get("tokens_identical") else "no")
        ]
    if name == "bench_choices_sglang":
        return [f"each extra choice adds **{fmt(data['per_extra_choice_s'], 3)} s** to a request"]
    return []


def runs_of(data: dict) -> int | None:
    return (data.get("config") or {}).get("runs", data.get("runs"))


def workload_of(name: str, data: dict) -> str:
    cfg = data.get("config") or {}
    if name.startswith("serving"):
        return (
            f"; model `{Path(cfg.get('model_path', '?')).name}`, input {cfg.get('input_min')}.."
            f"{cfg.get('input_max')} tokens, output {cfg.get('output_len')} tokens, "
            f"{cfg.get('requests_per_client')} requests per client (at least "
            f"{cfg.get('min_requests')}), {'Text' if cfg.get('text_mode') else 'Tokens'} mode"
        )
    if name == "preprocess_loop":
        return f"; {cfg.get('tokens'):,}-token chat"
    if name == "bench_aiperf":
        return aiperf_report.workload(data)
    if name.startswith("bench_kv_routing"):
        load = (data.get("machine") or {}).get("loadavg_1m_at_start", "?")
        return (f"; {cfg.get('prefixes')} prefixes x {1 + cfg.get('repeats', 0)} requests of "
                f"{cfg.get('prefix_tokens')}+16 tokens, load average {load} at start; "
                f"`python -m benchmarks.bench_kv_routing --arms {cfg.get('arm', 'agg')} "
                f"--runs {runs_of(data)} --prefixes {cfg.get('prefixes')} "
                f"--repeats {cfg.get('repeats')}`")
    return ""


def render(out: Path, image_prefix: str, docs: bool) -> str:
    parts, machine, smoke = [], None, False
    parts.append(INTRO if docs else "# Benchmark results\n")
    parts.append("## The serving path's goals in this run\n")
    parts.append(goals.render(lambda name: load(out, name)))
    for name, title, prose in SECTIONS:
        data = load(out, name)
        parts.append(f"## {title}\n")
        if docs:
            parts.append(prose.strip() + "\n")
        if data is None:
            parts.append(f"(not run: no {name}.json)\n")
            continue
        machine = machine or data.get("machine")
        runs = runs_of(data)
        smoke = smoke or (isinstance(runs, int) and runs < 3)
        started = (data.get("machine") or {}).get("time", "?")
        parts.append(
            (f"Median of {runs} runs" if runs else "Medians")
            + f"; run started {started}"
            + workload_of(name, data)
            + ".\n"
        )
        parts.append(table_of(name, data) + "\n")
        lines = headline(name, data)
        if lines:
            parts.append("\n".join(f"- {line}" for line in lines) + "\n")
        if (out / f"{name}.png").exists():
            parts.append(f"![{title}]({image_prefix}{name}.png)\n")
    if machine:
        parts.append(
            "## Machine of this run\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in machine.items())
            + "\n"
        )
    if docs:
        parts.append(FOOTER)
    if smoke:
        parts.insert(
            1,
            "> **Smoke-run numbers** (fewer than 3 runs somewhere): regenerate with "
            "`bash benchmarks/run_all.sh --publish` on an idle machine.\n",
        )
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=None, help="results directory to read (default results/)")
    p.add_argument("--docs", default=None, help="write the docs page here, reading docs/bench/")
    args = p.parse_args(argv)
    if args.docs:
        page = Path(args.docs)
        bench_dir = REPO_ROOT / "docs" / "bench"
        page.write_text(render(bench_dir, "bench/", docs=True))
        return
    print(render(results_dir(args.out), "", docs=False))


if __name__ == "__main__":
    main()
