"""CPU per request of this worker's prefill handler against Dynamo 1.6.1's own
(`dynamo.sglang`'s PrefillWorkerHandler), side by side in one process.

What bench_aiperf measures for a prefill worker process is SGLang's tokenizer manager, Dynamo's
bindings and the handler; only the handler differs between the two workers. Here both handlers
serve the same frontend-orchestrated prefill legs (Dynamo 1.6.1's flat request with its
`bootstrap_info`, PROMPT_TOKENS token ids) from the same synthetic engine with SGLang's Engine
API (one chunk, finished), on uvloop as the workers run, in interleaved rounds. This worker's
handler also runs with its room watch (a leg watched and unwatched, no decode connected), and
the parts it does that 1.6.1's does not are timed alone: validating the request (a bad one is
a 400 naming the field; 1.6.1 reads the dict as it comes) and the room watch. Both log as
they do in a worker (SGLang's handler, at INFO).

    python -m benchmarks.bench_prefill_handler [--requests 2000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import timeit
from types import SimpleNamespace

import uvloop

from benchmarks.common import format_table, median, results_dir, write_json
from benchmarks.synthetic_engine import SyntheticEngine
from harness.topology import engine_env

PROMPT_TOKENS = 256
ARMS = ("dynamo.sglang", "this worker")


def flat_request(room: int) -> dict:
    return {"token_ids": list(range(1, PROMPT_TOKENS + 1)), "stop_conditions": {"max_tokens": 1},
            "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2],
            "routing": {"prefill_worker_id": 7},
            "bootstrap_info": {"bootstrap_host": "127.0.0.1", "bootstrap_port": 12345,
                               "bootstrap_room": room}}


class _Context:
    """What both handlers read of Dynamo's request Context; the client never stops."""

    def __init__(self) -> None:
        self._stopped: asyncio.Future | None = None

    def id(self) -> str:
        return "bench"

    def is_stopped(self) -> bool:
        return False

    def trace_headers(self) -> None:
        return None

    def async_killed_or_stopped(self) -> asyncio.Future:
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
        return self._stopped


def dynamo_handler(engine: SyntheticEngine):
    from dynamo.sglang.request_handlers.llm.prefill_handler import PrefillWorkerHandler

    args = SimpleNamespace(disaggregation_bootstrap_port=12345, dist_init_addr=None,
                           enable_trace=False, schedule_low_priority_values_first=False)
    engine.tokenizer_manager.server_args = args
    config = SimpleNamespace(server_args=args, serving_mode=None,
                             dynamo_args=SimpleNamespace(use_sglang_tokenizer=False))
    return PrefillWorkerHandler(engine, config, None)


async def own_handler(engine: SyntheticEngine):
    from components.worker.rooms.watch import RoomWatchServer
    from handlers import PrefillConfig, PrefillHandler
    from handlers.disagg.orchestration import Orchestration

    rooms = RoomWatchServer("127.0.0.1")
    await rooms.start()
    return PrefillHandler(engine, PrefillConfig("127.0.0.1", 12345, Orchestration("frontend")),
                          rooms), rooms


async def serve(handler, rooms: range) -> None:
    for room in rooms:
        async for _ in handler.generate(flat_request(room), _Context()):
            pass


async def measure(requests: int, rounds: int) -> dict[str, list[float]]:
    engine = SyntheticEngine(with_text=False)
    own, watch = await own_handler(engine)
    handlers = {"dynamo.sglang": dynamo_handler(engine), "this worker": own}
    us: dict[str, list[float]] = {arm: [] for arm in ARMS}
    next_room = 1
    for arm in ARMS:  # warm-up
        await serve(handlers[arm], range(next_room, next_room + 200))
        next_room += 200
    for r in range(rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            start = time.process_time()
            await serve(handlers[arm], range(next_room, next_room + requests))
            us[arm].append((time.process_time() - start) / requests * 1e6)
            next_room += requests
    await watch.close()
    return us


def parts() -> dict[str, float]:
    """Microseconds per call of what this worker's prefill does that 1.6.1's does not."""
    from handlers.disagg.frontend_disagg import prefill_leg

    request = flat_request(1)
    n = 5000
    out = {"validating the request": min(timeit.repeat(lambda: prefill_leg(request),
                                                           number=n, repeat=3)) / n * 1e6}

    async def watch() -> float:
        from components.worker.rooms.watch import RoomWatchServer
        server = RoomWatchServer("127.0.0.1")
        await server.start()
        start = time.process_time()
        for room in range(1, n + 1):
            server.unwatch(room, server.watch(room))
        await server.close()
        return (time.process_time() - start) / n * 1e6

    out["the room watch (watch, unwatch)"] = uvloop.run(watch())
    return out


def log_as_the_workers_do() -> None:
    """INFO to a file in SGLang's format, as `sglang.Engine` sets up every worker process: this
    worker's prefill logs one line per leg there (1.6.1's logs its legs at DEBUG). Importing
    dynamo.sglang gives the root logger Dynamo's own handler, which no worker here runs with."""
    import dynamo.sglang.request_handlers.llm.prefill_handler  # noqa: F401  (its handler first)

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115  (open for the run)
    sink.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    root.addHandler(sink)
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="requests per arm per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default=None, help="results directory (default results/)")
    args = p.parse_args(argv)
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        # dynamo.sglang imports SGLang, which needs its CPU switch and stand-ins here.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.bench_prefill_handler",
                                   *(sys.argv[1:] if argv is None else argv)],
                  {**os.environ, **engine_env("sglang")})
    log_as_the_workers_do()
    us = uvloop.run(measure(args.requests, args.rounds))
    med = {arm: median(v) for arm, v in us.items()}
    extra = parts()
    rows = [[arm, f"{med[arm]:.1f}", " ".join(f"{x:.0f}" for x in us[arm])] for arm in ARMS]
    print(f"\nprefill handler CPU per request, {PROMPT_TOKENS}-token frontend-orchestrated legs, "
          f"median of {args.rounds} rounds of {args.requests}:")
    print(format_table(["handler", "us/request", "rounds"], rows))
    ratio = med["this worker"] / med["dynamo.sglang"]
    print(f"this worker / dynamo.sglang: {ratio:.2f}x")
    for what, value in extra.items():
        print(f"  of this worker's, {what}: {value:.1f} us")
    out = results_dir(args.out)
    write_json(out, "bench_prefill_handler", {
        "config": {"requests": args.requests, "rounds": args.rounds,
                   "prompt_tokens": PROMPT_TOKENS},
        "command": "python -m benchmarks.bench_prefill_handler", "us_per_request": us,
        "median_us": med, "ratio": ratio, "parts_us": extra})
    print(f"\nwrote {out}/bench_prefill_handler.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
