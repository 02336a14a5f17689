"""The project's CPU engine (components/engine/) behind `EngineBackend`."""

from __future__ import annotations

import argparse
import socket
from types import MappingProxyType
from typing import Any

from components.backends import cpu_flags
from components.backends.limits import EngineLimits
from components.backends.node import EngineNode
from components.backends.load import KvLoad


class CpuBackend:
    name = "cpu"
    kv_events_over_zmq = False  # the engine reports to an in-process listener
    own_sglang_metrics = False  # the worker reads `sglang:*` values from the engine
    probes_own_kv_path = True  # its transport's path probe (disagg/transport/path_probe.py)

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        cpu_flags.add_cpu_engine_flags(parser)

    def expand_argv(self, parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
        return argv

    def engine_args(self, ns: argparse.Namespace) -> Any:
        return MappingProxyType(cpu_flags.engine_kwargs(ns))

    def tokenizer_worker_count(self, engine_args: Any) -> int:
        return int(engine_args.get("tokenizer_worker_num", 1))

    def build(self, engine_args: Any) -> Any:
        kwargs = dict(engine_args)
        if kwargs.pop(cpu_flags.ENGINE_PROCESS_KEY, None) == cpu_flags.SEPARATE:
            return _start_separate(kwargs)
        from components.engine.process.engine import CpuEngine  # torch: only once chosen

        return CpuEngine(**kwargs)

    def attach(self, parent_pid: int) -> Any:
        from components.engine.process.engine import CpuEngine

        return CpuEngine.attach_tokenizer_worker(parent_pid)

    def limits(self, engine: Any) -> EngineLimits:
        return EngineLimits(
            context_length=int(engine.context_length),
            max_total_num_tokens=int(engine.max_total_num_tokens),
            max_running_requests=engine.max_running_requests,
            page_size=int(engine.page_size),
            max_num_batched_tokens=int(engine.server_args.max_prefill_tokens),
        )

    def local_ip(self) -> str:
        return socket.gethostbyname(socket.gethostname())

    def node(self, engine_args: Any) -> EngineNode:
        return EngineNode()  # one node, one process

    def bootstrap_host(self, engine: Any) -> str | None:
        return None

    def kv_block_size(self, engine: Any) -> int:
        return int(engine.page_size)

    async def warmup_prefill(self, engine: Any) -> None:
        """Nothing to compile or allocate lazily."""

    def abort_process_requests(self, engine: Any, prefix: str) -> None:
        """The engine does so itself when the attached process's connection drops."""

    def end_orphaned_requests(self, engine: Any, message: str) -> int:
        end_all = getattr(engine, "end_all", None)  # the worker's own engine process exited
        # An attached process's attachment ends them itself when its connection drops.
        return end_all() if callable(end_all) else 0

    def requests_in_flight(self, engine: Any) -> int | None:
        return engine.requests_in_flight()

    def tracked_rids(self, engine: Any) -> list[str] | None:
        return None

    def scheduler_requests(self, engine: Any) -> int | None:
        return None

    def kv_event_dp_ranks(self, engine: Any) -> range:
        return range(1)  # one engine, no data parallelism

    def kv_used_blocks(self, engine: Any, page_size: int) -> dict[int, int] | None:
        return None  # the engine reports its load to its KV event listener itself

    def kv_load(self, engine: Any, page_size: int) -> list[KvLoad] | None:
        if not callable(getattr(engine, "request_totals", None)):
            return None  # an attached process: the engine process reports its engine
        total = engine.kv_pages_total()
        return [KvLoad(dp_rank=0, total_blocks=total, hit_rate=engine.request_totals().hit_rate,
                       usage=engine.kv_pages_in_use() / total if total else 0.0)]


def _start_separate(engine_kwargs: dict[str, Any]) -> Any:
    """`--cpu-engine-process separate`: the engine in a process of its own, this one's API to
    it; a failed start stops the worker naming why."""
    from components.engine.process.launch import (EngineProcessFailed, kill_engine_process,
                                                  start_engine_process)
    from components.engine.process.remote import RemoteCpuEngine

    try:
        proc = start_engine_process(engine_kwargs)
    except EngineProcessFailed as exc:
        raise SystemExit(str(exc)) from None
    try:
        return RemoteCpuEngine(proc)
    except BaseException:  # no answer on its socket, or told to stop meanwhile
        kill_engine_process(proc)
        raise
