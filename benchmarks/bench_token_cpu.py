"""Where each output token's CPU goes: CPU time per output token for every process and thread
group of the stack, under a closed-loop streaming load through the real Dynamo frontend.

Arms, measured in one run with interleaved repetitions:
  engine - the same workload straight into an aggregated CPU engine in this process (baseline for
           tok/s and TTFT);
  agg    - frontend + one aggregated worker;
  agg-separate - the same with `--cpu-engine-process separate`: its "engine thread" column is
           the whole engine process (`agg-engine`: engine thread, relay, read-out pushes);
  agg-interval2 - the same with SGLang's `--stream-interval 2` (a chunk every 2 tokens, the
           first at once): what an operator trading chunk size for CPU gets;
  disagg - frontend + prefill worker + decode worker, KV over NIXL;
  mocker - frontend + Dynamo's own Rust mocker (`python -m dynamo.mocker`), the reference for what
           the frontend and a native worker cost per token;
  floor  - frontend + a Python worker that only streams (benchmarks/floor_worker.py): what
           Dynamo's Python bindings alone cost per token, the floor under `agg`'s worker.
Thread groups (benchmarks/thread_cpu.py): a worker's `loop` (asyncio event loop), `bridge` (Dynamo
runtime's threads: request plane and the Rust <-> Python bridge) and `engine` (the CPU engine's
thread); the frontend and the mocker as whole processes. The load: `--concurrency` streams of
short prompts (`tiny` model: the engine's compute is near zero, so the plumbing shows), plus a
concurrency-1 pass for TTFT.

    python -m benchmarks.bench_token_cpu [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.common import TINY_MODEL, limit_cpu_threads, require_model, results_dir, write_json
from benchmarks.loadgen import run_closed_loop, summarize
from benchmarks.proc_tree_cpu import descendants
from benchmarks.serving_arms import spawn_topology
from benchmarks.thread_cpu import CpuSampler
from benchmarks.token_cpu_report import report
from benchmarks.workload import Workload, make_prompts
from harness.topology import Stack

logger = logging.getLogger("bench_token_cpu")
ARMS = ("engine", "agg", "agg-separate", "agg-interval2", "disagg", "mocker", "floor")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-path", default=str(TINY_MODEL))
    p.add_argument("--arms", default=",".join(ARMS), help="comma list of " + ",".join(ARMS))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--input-min", type=int, default=16)
    p.add_argument("--input-max", type=int, default=64)
    p.add_argument("--ttft-requests", type=int, default=8, help="concurrency-1 requests per run")
    p.add_argument("--runs", type=int, default=3, help="repetitions; the median is reported")
    p.add_argument("--mocker-speedup-ratio", type=float, default=1.4,
                   help="the mocker's simulated engine speed (dynamo.mocker --speedup-ratio; 1.4 puts it at agg's pace here)")
    p.add_argument("--floor-step-ms", type=float, default=3.5,
                   help="the floor worker's token period per stream (agg's pace on 2 cores)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run, fewer requests")
    p.add_argument("--out", default=None, help="results directory (default results/)")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.requests_per_client, args.ttft_requests = 1, 2, 4
    args.arms = [a for a in ARMS if a in args.arms.split(",")]
    return args


class ReferenceStack(Stack):
    """The frontend with a reference worker: Dynamo's mocker or the Python floor."""

    def start_mocker(self, served: str, speedup: float) -> None:
        argv = [sys.executable, "-m", "dynamo.mocker", "--model-path", self.model_path,
                "--model-name", served, "--discovery-backend", "file", "--request-plane", "tcp",
                "--speedup-ratio", str(speedup)]
        self._spawn("mocker", argv, self.env())

    def start_floor(self, served: str, step_ms: float) -> None:
        argv = [sys.executable, "-m", "benchmarks.floor_worker", "--model-path", self.model_path,
                "--served-model-name", served, "--step-ms", str(step_ms)]
        self._spawn("floor", argv, self.env())


def start_stacks(args: argparse.Namespace, served: str) -> dict[str, Stack]:
    stacks: dict[str, Stack] = {}
    for name in ("agg", "agg-separate", "agg-interval2", "disagg"):
        if name in args.arms:
            stacks[name] = spawn_topology(name, args.model_path, served, True)
    for name in ("mocker", "floor"):
        if name not in args.arms:
            continue
        stack = ReferenceStack(Path(tempfile.mkdtemp(prefix=f"bench-{name}-")),
                               args.model_path, namespace=f"bench{name}")
        stack.start_frontend()
        if name == "mocker":
            stack.start_mocker(served, args.mocker_speedup_ratio)
        else:
            stack.start_floor(served, args.floor_step_ms)
        stacks[name] = stack
    for name, stack in stacks.items():
        stack.wait_ready(served, probe=True)
        logger.info("%s ready at %s", name, stack.url)
    return stacks


def pids_of(stack: Stack | None) -> dict[str, int]:
    """The stack's processes, and this one (the HTTP client; for `engine` also the engine)."""
    pids = {"client": os.getpid()}
    if stack is not None:
        pids.update({name: proc.popen.pid for name, proc in stack.procs.items()})
        for name, proc in stack.procs.items():  # --cpu-engine-process separate: its child
            for child in descendants([proc.popen.pid])[1:]:
                if b"components.engine.process" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids[f"{name}-engine"] = child
    return pids


async def measure(args, sends: dict, stacks: dict[str, Stack], prompts, ttft_prompts) -> dict:
    for send in sends.values():  # first requests pay one-off costs (allocation, UCX wire-up)
        await run_closed_loop(send, prompts[:2], 2, 120.0)
    runs: dict = {name: [] for name in sends}
    for rep in range(args.runs):
        order = list(sends)[rep % len(sends):] + list(sends)[:rep % len(sends)]
        for name in order:
            single, wall1 = await run_closed_loop(sends[name], ttft_prompts, 1, 120.0)
            sampler = CpuSampler(pids_of(stacks.get(name)))
            sampler.start()
            loaded, wall = await run_closed_loop(sends[name], prompts, args.concurrency, 300.0)
            cpu = sampler.stop()
            run = summarize(loaded, wall, args.output_len)
            run["ttft_c1_p50_ms"] = summarize(single, wall1, args.output_len)["ttft_p50_ms"]
            run["cpu_s"] = cpu
            run["cpu_s_by_thread_name"] = sampler.by_name
            run["tokens"] = sum(r.tokens_received for r in loaded if r.ok)
            # Each token-carrying chunk but the first has one ITL: chunks = ITLs + 1 per request.
            chunks = sum(len(r.itls) + 1 for r in loaded if r.ok and r.tokens_received)
            run["tokens_per_chunk"] = run["tokens"] / chunks if chunks else float("nan")
            runs[name].append(run)
            logger.info("run %d %s: %.0f tok/s", rep, name, run["output_tok_per_s"])
    return runs


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "components.engine"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    limit_cpu_threads(1)
    require_model(Path(args.model_path), "tiny")
    from transformers import AutoTokenizer

    from benchmarks.engine_client import EngineArm, start_engine
    from benchmarks.http_client import ChatClient

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    n = args.concurrency * args.requests_per_client
    prompts = make_prompts(tokenizer, Workload(n, args.input_min, args.input_max,
                                               args.output_len, 0))
    ttft_prompts = make_prompts(tokenizer, Workload(args.ttft_requests, args.input_min,
                                                    args.input_max, args.output_len, 1))
    served = Path(args.model_path).name
    stacks: dict[str, Stack] = {}
    engine = None
    try:
        stacks = start_stacks(args, served)
        sends, clients = {}, []
        if "engine" in args.arms:
            engine = start_engine(args.model_path)
            sends["engine"] = EngineArm(engine, args.output_len).send
        for name, stack in stacks.items():
            clients.append(ChatClient(stack.url, served, args.output_len, args.concurrency))
            sends[name] = clients[-1].send

        async def go() -> dict:
            try:
                return await measure(args, sends, stacks, prompts, ttft_prompts)
            finally:
                for client in clients:
                    await client.close()

        runs = asyncio.run(go())
    finally:
        for stack in stacks.values():
            stack.stop()
            shutil.rmtree(stack.workdir, ignore_errors=True)
        if engine is not None:
            engine.shutdown()
    payload = report(args, runs)
    write_json(results_dir(args.out), "token_cpu", payload)
    print(f"\nwrote {results_dir(args.out)}/token_cpu.json")
    return 1 if payload["integrity_problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
