"""NVIDIA aiperf (`aiperf profile`, 0.13) against this worker and Dynamo 1.6.1's `dynamo.sglang`.

aiperf is the load generator and the metrics: synthetic chat prompts of `--input-tokens` tokens,
`--output-tokens` forced with `ignore_eos`, streamed through `/v1/chat/completions` at a fixed
concurrency for `--requests` requests after a warm-up of `--concurrency` requests; output tok/s,
TTFT and ITL percentiles come from its JSON export (benchmarks/aiperf_report.py), token counts
from the server's `usage` (`--use-server-token-count`: the random model's text re-tokenizes to
other counts). Next to it, this benchmark samples the CPU of each arm's worker process trees
(worker and SGLang scheduler processes) and cuts out aiperf's measured phase.

Arms (benchmarks/aiperf_arms.py), all started once and measured in rotated order per repetition:
agg and disagg on the CPU engine, agg-sglang and disagg-sglang on `--engine sglang`, and
dynamo-sglang, the reference every ratio is taken against, and sglang-native(-disagg), SGLang's
own server behind its gateway smg (benchmarks/native_arms.py). aiperf lives in its own environment
(`make aiperf` -> .venv-aiperf: its dependencies clash with the project's pins), and so does smg
(`make smg` -> .venv-smg); SGLang's server needs requirements/bench.txt in .venv (`make bench`).

    python -m benchmarks.bench_aiperf [--quick] [--requests N] [--runs N]
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from benchmarks.aiperf_arms import ARMS, AiperfArms
from benchmarks.aiperf_report import (add_worker_cpu, arm_median, integrity_problems,
                                      load_export, ratios_to_reference, table)
from benchmarks.common import (REPO_ROOT, TINY_MODEL, format_table, require_model, results_dir,
                               write_json)
from benchmarks.native_arms import NATIVE_ARMS, missing_tools
from benchmarks.proc_tree_cpu import TreeCpuRecorder, cpu_between

logger = logging.getLogger("bench_aiperf")
AIPERF = REPO_ROOT / ".venv-aiperf" / "bin" / "aiperf"
# aiperf 0.13 logs this once its tokenizer and dataset are ready, before its warm-up requests.
AIPERF_CONFIGURED = b"AIPerf System is CONFIGURED"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(TINY_MODEL))
    p.add_argument("--arms", default=",".join(ARMS), help="comma list of " + ",".join(ARMS))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=64, help="measured requests per aiperf run")
    p.add_argument("--input-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--aiperf", default=os.environ.get("AIPERF", str(AIPERF)))
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds per aiperf run")
    p.add_argument("--quick", action="store_true", help="smoke run: 16 requests, 1 run")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    args = p.parse_args(argv)
    args.command = shlex.join(["python", "-m", "benchmarks.bench_aiperf",
                               *(sys.argv[1:] if argv is None else argv)])
    if args.quick:
        args.requests, args.runs = 16, 1
    args.arms = [a for a in args.arms.split(",") if a]
    unknown = set(args.arms) - set(ARMS)
    if unknown or args.runs < 1:
        p.error(f"unknown arms {sorted(unknown)}" if unknown else "--runs must be >= 1")
    return args


def aiperf_argv(args: argparse.Namespace, served: str, url: str, artifact_dir: Path) -> list[str]:
    return [args.aiperf, "profile", "--model", served, "--url", url,
            "--endpoint-type", "chat", "--streaming", "--tokenizer", args.model_path,
            "--synthetic-input-tokens-mean", str(args.input_tokens),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(args.output_tokens),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            "--warmup-request-count", str(args.concurrency), "--random-seed", "0",
            "--output-artifact-dir", str(artifact_dir), "--export-level", "summary",
            "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
            # aiperf's own processes share the 2 cores with the stack: as few as it allows.
            "--workers-max", "1", "--record-processor-service-count", "1"]


def run_aiperf(argv: list[str], log: Path, timeout: float,
               on_configured: Callable[[], None]) -> int:
    """aiperf's exit status, its output in `log`; `on_configured()` once its set-up is done."""
    # aiperf runs in its own environment. No HF_HUB_OFFLINE: aiperf 0.13 then takes the local
    # tokenizer directory for a hub repo id and fails; with a local path it reaches no network.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with (open(log, "wb") as out, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT) as proc):
        pump = threading.Thread(target=_pump, args=(proc.stdout, out, on_configured), daemon=True)
        pump.start()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        finally:
            pump.join(timeout=10.0)  # the pipe closes when aiperf exits


def _pump(stream, out, on_configured: Callable[[], None] | None) -> None:
    for line in stream:
        out.write(line)
        if on_configured is not None and AIPERF_CONFIGURED in line:
            on_configured()
            on_configured = None


def run_once(args, arms: AiperfArms, name: str, artifact_dir: Path) -> dict:
    argv = aiperf_argv(args, arms.served, arms.url(name), artifact_dir)
    log = artifact_dir.with_suffix(".log")
    artifact_dir.parent.mkdir(parents=True, exist_ok=True)
    with arms.only(name) as thaw, TreeCpuRecorder(arms.worker_pids(name)) as cpu:
        rc = run_aiperf(argv, log, args.run_timeout, thaw)
    if rc != 0:
        raise RuntimeError(f"aiperf exited with {rc} on {name}:\n"
                           + log.read_text(errors="replace")[-3000:])
    metrics = load_export(artifact_dir)
    metrics["loadavg_1m"] = os.getloadavg()[0]  # the machine is shared: how busy it was
    window = (metrics["start_s"], metrics["end_s"])
    processes = {role: cpu_between(cpu.root_samples[pid], *window)
                 for role, pid in arms.worker_roots(name).items()}
    return add_worker_cpu(metrics, cpu_between(cpu.samples, *window), processes)


def measure(args, arms: AiperfArms, scratch: Path) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name in args.arms}
    for rep in range(args.runs):
        order = args.arms[rep % len(args.arms):] + args.arms[:rep % len(args.arms)]
        for name in order:
            m = run_once(args, arms, name, scratch / f"run{rep}-{name}")
            runs[name].append(m)
            logger.info("run %d %s: %.1f tok/s, TTFT p50 %.1f ms, %.0f us CPU/token", rep, name,
                        m["output_tok_per_s"], m["ttft_p50_ms"], m["worker_cpu_us_per_token"])
    return runs


def report(args, runs: dict[str, list[dict]]) -> int:
    medians = {name: arm_median(rs) for name, rs in runs.items()}
    ratios = ratios_to_reference(medians, runs)
    headers, rows = table(medians, ratios)
    problems = integrity_problems(runs, args.requests)
    print(f"\naiperf, {args.input_tokens} in / {args.output_tokens} out tokens, concurrency "
          f"{args.concurrency}, {args.requests} requests, median of {args.runs} runs:")
    print(format_table(headers, rows))
    print("integrity (every request completed, no errors): "
          + ("OK" if not problems else "; ".join(problems)))
    example = aiperf_argv(args, "<model>", "<url>", Path("<dir>"))
    out = results_dir(args.out)
    write_json(out, "bench_aiperf", {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "command")},
        "command": args.command, "aiperf_command": shlex.join(["aiperf", *example[1:]]),
        "median": medians, "runs": runs, "ratios": ratios, "integrity_problems": problems,
        "table": {"headers": headers, "rows": rows}})
    print(f"\nwrote {out}/bench_aiperf.json")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the readiness polls
    args = parse_args(argv)
    require_model(Path(args.model_path), "tiny")
    if not Path(args.aiperf).exists():
        sys.exit(f"{args.aiperf} missing: run `make aiperf` (or pass --aiperf)")
    if set(args.arms) & set(NATIVE_ARMS) and (missing := missing_tools()):
        sys.exit(missing)
    keep = os.environ.get("BENCH_KEEP_LOGS") == "1"
    arms = AiperfArms(args.arms, args.model_path, keep)
    scratch = Path(tempfile.mkdtemp(prefix="aiperf-runs-"))  # aiperf's exports and logs
    try:
        arms.start()
        runs = measure(args, arms, scratch)
    finally:
        for kept in arms.stop():
            logger.info("logs kept in %s", kept)
        if keep:
            logger.info("aiperf exports kept in %s", scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return report(args, runs)


if __name__ == "__main__":
    sys.exit(main())
