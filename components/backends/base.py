"""The one engine switch: what the worker asks of whichever engine runs.

`select_backend` (components/backends/select.py) decides once, from `--engine`, and the worker
holds the chosen `EngineBackend` in its config; nothing else in the project asks which engine
runs. `cpu.py` and `sglang.py` implement it; only the `sglang_*.py` modules import `sglang`,
and only once the SGLang backend was chosen.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from components.backends.limits import EngineLimits
from components.backends.node import EngineNode
from components.backends.load import KvLoad


class EngineBackend(Protocol):
    name: str  # "cpu" | "sglang": for logs and error messages only
    # The engine publishes its KV events on the ZMQ endpoint of --kv-events-config (SGLang's
    # scheduler), rather than through an in-process listener (the CPU engine).
    kv_events_over_zmq: bool
    # The engine writes SGLang's `sglang:*` metrics itself (SGLang, with --enable-metrics); the
    # worker derives them from the engine's read-outs otherwise (the CPU engine).
    own_sglang_metrics: bool
    # The engine's KV transport checks its own path (the CPU engine's side channel); otherwise
    # the worker probes it with a one-token request over the room watch (rooms/kv_probe.py).
    probes_own_kv_path: bool

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """The engine's flags, with SGLang's names and meanings."""

    def expand_argv(self, parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
        """The command line with the engine's `--config` file merged in, where it has one."""

    def engine_args(self, ns: argparse.Namespace) -> Any:
        """Parsed flags -> what `build` takes (frozen)."""

    def tokenizer_worker_count(self, engine_args: Any) -> int:
        """`--tokenizer-worker-num`."""

    def build(self, engine_args: Any) -> Any:
        """Start the engine (loads the model; takes seconds)."""

    def attach(self, parent_pid: int) -> Any:
        """The Engine API in a tokenizer worker process, run by the engine of `parent_pid`."""

    def limits(self, engine: Any) -> EngineLimits:
        """What registration advertises and requests are bounded by."""

    def local_ip(self) -> str:
        """The address a peer dials when this worker binds a wildcard address."""

    def node(self, engine_args: Any) -> EngineNode:
        """Where the engine sits in an engine spread over several nodes (`--nnodes`)."""

    def bootstrap_host(self, engine: Any) -> str | None:
        """Where a decode dials this prefill engine's bootstrap server when the engine says
        (SGLang: `--dist-init-addr`'s host, its first node); None: the worker's address."""

    def kv_block_size(self, engine: Any) -> int:
        """The block size the router hashes by (also on a node that serves nothing)."""

    async def warmup_prefill(self, engine: Any) -> None:
        """One request through a prefill engine before it serves, where that pays."""

    def abort_process_requests(self, engine: Any, prefix: str) -> None:
        """An attached process is gone: abort the requests whose rids start with `prefix`."""

    def end_orphaned_requests(self, engine: Any, message: str) -> int:
        """This attached process's engine process is gone: end the requests it holds."""

    def requests_in_flight(self, engine: Any) -> int | None:
        """Requests the engine's front end still tracks."""

    def tracked_rids(self, engine: Any) -> list[str] | None:
        """The first rids the engine's front end tracks; None where it keeps none by rid."""

    def scheduler_requests(self, engine: Any) -> int | None:
        """Requests the engine's schedulers hold (every attached process's); None: unknown."""

    def kv_event_dp_ranks(self, engine: Any) -> range:
        """The DP ranks whose KV events this worker relays (those on its node)."""

    def kv_used_blocks(self, engine: Any, page_size: int) -> dict[int, int] | None:
        """KV blocks in use per DP rank, read from the engine's schedulers; None where the
        engine pushes its load itself (or it is unreadable)."""

    def kv_load(self, engine: Any, page_size: int) -> list[KvLoad] | None:
        """Each DP rank's KV pool size, usage and prefix-cache hit rate (Dynamo's component
        gauges); None where unreadable (an attached process, an engine not started)."""
