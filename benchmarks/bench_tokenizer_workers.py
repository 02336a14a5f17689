"""`--tokenizer-worker-num 1` against `2`, Text mode (the worker templates and tokenizes), side by
side in one run, each behind its own frontend:

  throughput - 16 concurrent chat streams (128-512-token prompts, 64 output tokens): tok/s;
  stall      - four short streams keep flowing while one 64k-token chat is templated and
               tokenized (then refused as longer than the context): the largest and p99 gap
               between their tokens while the long chat is in the worker. With 2 processes
               the frontend sends some of the short streams to the process that is not busy;
  loop lag   - over the same window, each worker process's own event-loop lag histogram
               (`/metrics`, components/worker/metrics/loop_lag.py): a bound on its largest lag, for
               the process that tokenized the long chat and for the other one, and the largest lag
               of an idle asyncio loop in a process of its own (`benchmarks/lag_probe.py`): what the
               2 loaded cores give any event loop, the floor under the workers' figures; and
               the workers' largest lag over 0.3 s with the short streams alone, just before.

    python -m benchmarks.bench_tokenizer_workers [--runs 3] [--tokens 65536]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from benchmarks.bench_preprocess_loop import long_chat
from benchmarks.common import (TINY_MODEL, format_table, median, new_figure, percentile, ratio,
                               require_model, results_dir, save_figure, write_json)
from benchmarks.http_client import ChatClient
from benchmarks.lag_probe import LagProbe
from benchmarks.loadgen import run_closed_loop, summarize
from benchmarks.workload import Workload, make_prompts
from harness.topology import Stack
from harness.worker_metrics import PREFIX, attached_pids, loop_lag_bound_s, scrape, system_port_of

ARMS = {"N=1": "1", "N=2": "2"}
SHORT_STREAMS = 4
CALM_WINDOW_S = 0.3  # the workers' loop lag with the short streams alone, before the long chat


def start(name: str, model_path: str, workers: str) -> Stack:
    stack = Stack(Path(tempfile.mkdtemp(prefix=f"bench-tw{workers}-")), model_path,
                  namespace=f"benchtw{workers}")
    stack.start_frontend()
    stack.start_worker("agg", "null", "tiny", "--log-level", "warning", "--context-length",
                       "2048", "--tokenizer-worker-num", workers, skip_tokenizer_init=False)
    return stack


async def throughput(stack: Stack, prompts, concurrency: int, output_len: int) -> dict:
    client = ChatClient(stack.url, "tiny", output_len, concurrency)
    try:
        results, wall = await run_closed_loop(client.send, prompts, concurrency, 300.0)
    finally:
        await client.close()
    return summarize(results, wall, output_len)


def worker_ports(stack: Stack) -> list[int]:
    """The engine process's system port, then each attached process's."""
    proc = stack.procs["agg"]
    return [proc.system_port, *(system_port_of(p) for p in attached_pids(proc.popen.pid))]


def loop_lags(ports: list[int], before: list, after: list) -> dict:
    """Lag bound (ms) of the process that preprocessed the long chat and of the others."""
    name = PREFIX + "preprocess_seconds_count"
    busy = max(range(len(ports)), key=lambda i: after[i][(name, "")] - before[i][(name, "")])
    lags = [loop_lag_bound_s(b, a) * 1e3 for b, a in zip(before, after)]
    others = [lag for i, lag in enumerate(lags) if i != busy]
    return {"lag_busy_ms": lags[busy], "lag_other_ms": max(others, default=float("nan"))}


async def stall(stack: Stack, messages: list[dict], probe: LagProbe) -> dict:
    """Gaps (ms) between the short streams' tokens while the long chat is in the worker, and
    each process's loop lag over that window."""
    ports = worker_ports(stack)
    arrivals: list[list[float]] = [[] for _ in range(SHORT_STREAMS)]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True, "temperature": 0.0}
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as http:
        async def short(i: int) -> None:
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and '"content"' in line:
                        arrivals[i].append(time.perf_counter())
                        if window[1] is not None:
                            return

        window: list[float | None] = [None, None]
        tasks = [asyncio.create_task(short(i)) for i in range(SHORT_STREAMS)]
        while not all(len(a) > 5 for a in arrivals):
            await asyncio.sleep(0.01)
        # Off the loop: a blocking read here would delay the short streams' arrival stamps.
        calm = await asyncio.to_thread(lambda: [scrape(port) for port in ports])
        await asyncio.sleep(CALM_WINDOW_S)  # the streams alone, as the reference window
        before = await asyncio.to_thread(lambda: [scrape(port) for port in ports])
        await asyncio.to_thread(probe.mark)
        window[0] = time.perf_counter()
        r = await http.post("/v1/chat/completions", json={**body, "messages": messages,
                                                           "stream": False, "max_tokens": 1})
        window[1] = time.perf_counter()
        idle_loop_lag_ms = await asyncio.to_thread(probe.mark)
        after = await asyncio.to_thread(lambda: [scrape(port) for port in ports])
        assert r.status_code == 400, r.text  # longer than the context: refused after tokenizing
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    gaps = [(b - a) * 1e3 for times in arrivals for a, b in zip(times, times[1:])
            if window[0] <= b <= window[1]]
    return {"max_gap_ms": max(gaps, default=0.0), "p99_gap_ms": percentile(gaps, 99),
            "long_chat_s": window[1] - window[0], "lag_idle_loop_ms": idle_loop_lag_ms,
            "lag_streams_only_ms": max(loop_lag_bound_s(c, b) for c, b in zip(calm, before)) * 1e3,
            **loop_lags(ports, before, after)}


async def measure(args: argparse.Namespace, stacks: dict[str, Stack], tok) -> dict:
    prompts = make_prompts(tok, Workload(num_prompts=64, input_min=128, input_max=512,
                                         output_len=64))
    messages = long_chat(tok, args.tokens, seed=0)
    runs: dict[str, list[dict]] = {arm: [] for arm in stacks}
    probe = LagProbe()
    try:
        for _ in range(args.runs):
            for arm, stack in stacks.items():  # interleaved: drift hits both arms alike
                run = await throughput(stack, prompts, 16, 64)
                run.update(await stall(stack, messages, probe))
                runs[arm].append(run)
    finally:
        probe.close()
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--model-path", default=str(TINY_MODEL))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    require_model(Path(args.model_path), "tiny")
    tok = AutoTokenizer.from_pretrained(args.model_path)
    stacks = {arm: start(arm, args.model_path, n) for arm, n in ARMS.items()}
    try:
        for stack in stacks.values():
            stack.wait_ready("tiny", probe=True)
        runs = asyncio.run(measure(args, stacks, tok))
    finally:
        for stack in stacks.values():
            stack.stop()
            shutil.rmtree(stack.workdir, ignore_errors=True)
    report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, list[dict]]) -> None:
    keys = ("output_tok_per_s", "max_gap_ms", "p99_gap_ms", "lag_busy_ms", "lag_other_ms",
            "lag_streams_only_ms", "lag_idle_loop_ms", "long_chat_s")
    med = {arm: {k: median(r[k] for r in rs) for k in keys} for arm, rs in runs.items()}
    headers = ["arm", "tok/s (c=16)", "max gap ms", "p99 gap ms", "loop lag <= ms (busy)",
               "loop lag <= ms (other)",
               "loop lag <= ms, streams only", "idle loop lag ms",
               "64k chat s", "tok/s vs N=1"]
    rows = [[arm, *(med[arm][k] for k in keys),
             ratio(med[arm]["output_tok_per_s"], med["N=1"]["output_tok_per_s"])] for arm in med]
    print(format_table(headers, rows))
    out = results_dir(args.out)
    write_json(out, "tokenizer_workers", {
        "config": vars(args), "runs": runs, "median": med,
        "table": {"headers": headers, "rows": rows},
        "speedup": ratio(med["N=2"]["output_tok_per_s"], med["N=1"]["output_tok_per_s"])})
    fig, (a, b) = new_figure(ncols=2, width=9)
    a.bar(list(med), [med[m]["output_tok_per_s"] for m in med])
    a.set_title("Text-mode tok/s, concurrency 16")
    b.bar(list(med), [med[m]["max_gap_ms"] for m in med])
    b.set_title("largest token gap during a 64k chat (ms)")
    save_figure(fig, out, "tokenizer_workers")


if __name__ == "__main__":
    main()
