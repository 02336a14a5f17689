"""What a worker costs doing nothing: the CPU an idle, registered worker's process tree uses,
next to Dynamo 1.6.1's own SGLang worker and the Python floor, measured in one run.

Arms (each behind its own frontend, started, probed with one request, then left alone):
  cpu           - `python -m components`, aggregated, Tokens mode, the CPU engine;
  cpu-separate  - the same with `--cpu-engine-process separate` (the engine process a child);
  sglang        - the same on `--engine sglang` (SGLang's CPU path: scheduler and detokenizer
                  processes as children);
  dynamo-sglang - `python -m dynamo.sglang` with the same SGLang flags;
  floor         - benchmarks/floor_worker.py: an endpoint that only streams (Dynamo's bindings).
For each arm: the worker's own process (the event loop, Dynamo's runtime threads, the CPU
engine's thread) and its whole process tree (SGLang's children too), in cores, over `--window`
seconds after `--settle` seconds of quiet. Goal (issue: no idle cost): the worker's own process
<= 0.002 cores.

    python -m benchmarks.bench_idle_cpu [--window 20] [--arms cpu,sglang,dynamo-sglang,floor]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.bench_token_cpu import ReferenceStack
from benchmarks.common import TINY_MODEL, format_table, require_model, results_dir, write_json
from benchmarks.proc_tree_cpu import descendants, process_cpu_s

ARMS = ("cpu", "cpu-separate", "sglang", "dynamo-sglang", "floor")
SERVED = "idle"
GOAL_CORES = 0.002
READY_S = 420.0
FLOOR_STEP_MS = 3.5
SGLANG_FLAGS = ("--context-length", "2048", "--max-total-tokens", "8192", "--page-size", "16")


def start(stack: ReferenceStack, arm: str) -> int:
    endpoint = ("--endpoint", "dyn://dynamo.idle.generate")
    if arm in ("cpu", "cpu-separate"):
        separate = ("--cpu-engine-process", "separate") if arm == "cpu-separate" else ()
        proc = stack.start_worker("w", "null", SERVED, "--page-size", "16", *endpoint,
                                  *separate, skip_tokenizer_init=True)
    elif arm == "sglang":
        proc = stack.start_worker("w", "null", SERVED, *SGLANG_FLAGS, *endpoint,
                                  skip_tokenizer_init=True, engine="sglang")
    elif arm == "dynamo-sglang":
        proc = stack.start_dynamo_sglang("w", "--served-model-name", SERVED, *SGLANG_FLAGS,
                                         *endpoint, "--skip-tokenizer-init")
    else:
        stack.start_floor(SERVED, FLOOR_STEP_MS)
        proc = stack.procs["floor"]
    stack.wait_ready(SERVED, probe=True, timeout=READY_S)
    return proc.popen.pid


def measure(arm: str, model: str, settle: float, window: float) -> dict[str, float]:
    stack = ReferenceStack(Path(tempfile.mkdtemp(prefix=f"idle-{arm}-")), model)
    try:
        stack.start_frontend()
        pid = start(stack, arm)
        time.sleep(settle)  # a benchmark's quiet period, not a synchronization
        pids = descendants([pid])
        own0, tree0, t0 = process_cpu_s(pid), sum(map(process_cpu_s, pids)), time.monotonic()
        time.sleep(window)
        own1, tree1, t1 = process_cpu_s(pid), sum(map(process_cpu_s, pids)), time.monotonic()
        span = t1 - t0
        return {"worker_cores": (own1 - own0) / span, "tree_cores": (tree1 - tree0) / span,
                "processes": len(pids)}
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(TINY_MODEL))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--window", type=float, default=20.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    require_model(Path(args.model_path), "tiny")
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)}; choose from {','.join(ARMS)}")
    results = {arm: measure(arm, args.model_path, args.settle, args.window) for arm in arms}
    headers = ("arm", "worker process cores", "process tree cores", "processes")
    rows = [(arm, f"{r['worker_cores']:.4f}", f"{r['tree_cores']:.4f}", r["processes"])
            for arm, r in results.items()]
    print(format_table(headers, rows))
    write_json(results_dir(args.out), "idle_cpu",
               {"window_s": args.window, "goal_worker_cores": GOAL_CORES, "arms": results,
                "table": {"headers": list(headers), "rows": [list(r) for r in rows]}})


if __name__ == "__main__":
    main()
