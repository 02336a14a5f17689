"""The serving benchmark's arms: topologies started as processes (`harness/topology.py`), and the
in-process engine.

Each topology runs in a fresh run directory (its discovery files and logs) and its own Dynamo
namespace; the directory is removed on stop unless start-up failed or BENCH_KEEP_LOGS=1.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from pathlib import Path

from harness.topology import Stack, free_port

logger = logging.getLogger("bench_serving")
# Worker name and --disaggregation-mode per process, after the frontend.
DISAGG_WORKERS = (("prefill", "prefill"), ("decode", "decode"))
AGG_WORKER = (("agg", "null"),)
WORKERS = {"agg": AGG_WORKER, "agg-separate": AGG_WORKER, "agg-chunked": AGG_WORKER,
           "agg-interval2": AGG_WORKER, "disagg": DISAGG_WORKERS,
           "disagg-decode": DISAGG_WORKERS, "disagg-cache": DISAGG_WORKERS}
TOPOLOGY_ARGS = {
    # The reference arm without chunked prefill (the CPU engine chunks by 512 by default).
    "agg": ("--chunked-prefill-size", "-1"),
    # The same with the engine in a process of its own (its own GIL).
    "agg-separate": ("--chunked-prefill-size", "-1", "--cpu-engine-process", "separate"),
    # SGLang's chunked prefill with mixed batches: a long prompt delays running rows by one chunk.
    "agg-chunked": ("--chunked-prefill-size", "256", "--enable-mixed-chunk"),
    # SGLang's --stream-interval: a chunk every 2 tokens (the first at once), half the items.
    "agg-interval2": ("--stream-interval", "2"),
    # `disagg` runs the workers' default style (frontend-orchestrated in Tokens mode);
    # `disagg-decode` the decode-orchestrated one
    # (docs/reference/orchestration.md).
    "disagg-decode": ("--disagg-orchestrator", "decode"),
    # `disagg` with a decode that keeps a prefix cache (the prefill engine ignores the flag).
    "disagg-cache": ("--disaggregation-decode-enable-radix-cache",),
}
TOPOLOGIES = tuple(WORKERS)


def spawn_topology(name: str, model_path: str, served: str, skip_tokenizer_init: bool) -> Stack:
    """Start the processes of topology `name` (one of TOPOLOGIES); not yet ready."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    stack = Stack(run_dir, model_path, namespace=f"bench{name}")
    stack.start_frontend()
    for worker, mode in WORKERS[name]:
        extra = ["--disaggregation-bootstrap-port", str(free_port())] if mode == "prefill" else []
        extra += TOPOLOGY_ARGS.get(name, ())
        stack.start_worker(worker, mode, served, "--log-level", "warning", *extra,
                           skip_tokenizer_init=skip_tokenizer_init)
    return stack


class Arms:
    """The started arms; `send[name]` is each arm's request function."""

    def __init__(self, args: argparse.Namespace, tokenizer) -> None:
        self.args, self.tokenizer = args, tokenizer
        self.served = Path(args.model_path).name
        self.send: dict = {}
        self.topologies: dict[str, Stack] = {}
        self.keep_logs = os.environ.get("BENCH_KEEP_LOGS") == "1"
        self.clients: list = []
        self.engine = None

    def start(self) -> None:
        # Spawn every topology first so their start-ups overlap, then wait for each.
        try:
            for name in TOPOLOGIES:
                if name in self.args.arms:
                    self.topologies[name] = spawn_topology(
                        name, self.args.model_path, self.served, not self.args.text_mode)
            for name, stack in self.topologies.items():
                # The probe: a decode worker is listed before it has found its prefill peer.
                stack.wait_ready(self.served, probe=True)
                logger.info("%s ready at %s (logs %s)", name, stack.url, stack.workdir)
        except BaseException:
            self.keep_logs = True  # the error points at them
            raise
        if "engine" in self.args.arms:
            from benchmarks.engine_client import EngineArm, start_engine

            self.engine = start_engine(self.args.model_path)
            self.send["engine"] = EngineArm(self.engine, self.args.output_len).send

    def connect(self, concurrency: int) -> None:
        from benchmarks.http_client import ChatClient

        for name, stack in self.topologies.items():
            client = ChatClient(stack.url, self.served, self.args.output_len, concurrency)
            self.clients.append(client)
            self.send[name] = client.send

    async def close_clients(self) -> None:
        for client in self.clients:
            await client.close()
        self.clients.clear()

    def stop(self) -> None:
        for name, stack in self.topologies.items():
            stack.stop()
            if self.keep_logs:
                logger.info("%s logs kept in %s", name, stack.workdir)
            else:
                shutil.rmtree(stack.workdir, ignore_errors=True)
        if self.engine is not None:
            self.engine.shutdown()
