"""`sglang.Engine` behind `EngineBackend`. Importing this module does not import sglang (that
takes seconds and pulls in triton): `sglang_engine.py` is imported on first use, which is only
once `--engine sglang` was chosen."""

from __future__ import annotations

import argparse
from typing import Any

from components.backends import sglang_compat
from components.backends.limits import EngineLimits
from components.backends.node import EngineNode
from components.backends.load import KvLoad, blocks


def _engine_module() -> Any:
    from components.backends import sglang_engine

    return sglang_engine


def _positive_int(value: Any) -> int:
    # An SGLang without the field, or one exposing it as a derived-field descriptor: 1.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 1


def dp_layout(server_args: Any) -> tuple[int, bool]:
    """(DP ranks, whether they are attention-DP groups), Dynamo 1.6.1's rule
    (`capacity.sglang_dp_layout`). SGLang 0.5.23 resolves the deprecated `--dp-size N
    --enable-dp-attention` into `attn_dp_size=N, dp_size=1` (`parallel_hook.py`,
    `handle_deprecated_dp_attention`) and runs `dp_size * attn_dp_size` schedulers; an SGLang
    without `attn_dp_size` (0.5.21) keeps the two flags as given."""
    dp_size = _positive_int(getattr(server_args, "dp_size", 1))
    attn_dp_size = _positive_int(getattr(server_args, "attn_dp_size", 1))
    if attn_dp_size > 1:
        return dp_size * attn_dp_size, True
    if getattr(server_args, "enable_dp_attention", False):
        return dp_size, True
    # An elastic-EP scale joiner runs attention-DP paths (SGLang's `attn_dp_enabled_of`).
    return dp_size, getattr(server_args, "ep_join_mode", None) == "scale"


def local_dp_ranks(server_args: Any) -> range:
    """The DP ranks whose schedulers run on this node, each with its own KV cache and KV event
    port (Dynamo 1.6.1's `capacity.local_dp_rank_bounds`): every rank (pure DP is single-node
    in SGLang), or with attention DP across `--nnodes` this node's slice."""
    dp_size, attention_dp = dp_layout(server_args)
    if not attention_dp or dp_size == 1:
        return range(dp_size)
    nnodes = int(getattr(server_args, "nnodes", 1) or 1)
    local = dp_size // nnodes
    start = int(getattr(server_args, "node_rank", 0) or 0) * local
    return range(start, start + local)


class SglangBackend:
    name = "sglang"
    kv_events_over_zmq = True  # SGLang's scheduler publishes on --kv-events-config's endpoint
    own_sglang_metrics = True  # with --enable-metrics, in its multiprocess directory
    probes_own_kv_path = False  # SGLang's NIXL connection: the worker probes through it

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        _engine_module().add_sglang_flags(parser)

    def expand_argv(self, parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
        return _engine_module().merge_config_file(parser, argv)

    def engine_args(self, ns: argparse.Namespace) -> Any:
        return _engine_module().server_args_from_namespace(ns)

    def tokenizer_worker_count(self, engine_args: Any) -> int:
        return int(getattr(engine_args, "tokenizer_worker_num", 1) or 1)

    def build(self, engine_args: Any) -> Any:
        return _engine_module().create_engine(engine_args)

    def attach(self, parent_pid: int) -> Any:
        return _engine_module().attach_engine(parent_pid)

    def limits(self, engine: Any) -> EngineLimits:
        return _engine_module().sglang_limits(engine)

    def node(self, engine_args: Any) -> EngineNode:
        from components.backends.sglang_nodes import engine_node

        return engine_node(engine_args)

    def bootstrap_host(self, engine: Any) -> str | None:
        from components.backends.sglang_nodes import dist_init_host

        return dist_init_host(engine.server_args)

    def kv_block_size(self, engine: Any) -> int:
        """Pages of page_size * dcp_size tokens (--dcp-size widens SGLang's radix tree's
        pages), read from the resolved flags: on a node other than the first there is no
        tokenizer manager to read `limits` from."""
        resolved = _engine_module().resolved_server_args(engine)
        return int(resolved.page_size or 1) * int(getattr(resolved, "dcp_size", 1) or 1)

    def local_ip(self) -> str:
        """The address SGLang's own bootstrap advertises (honours SGLANG_HOST_IP; the host name
        can resolve to a loopback alias such as 127.0.1.1, which no other machine can dial)."""
        return _engine_module().local_ip()

    async def warmup_prefill(self, engine: Any) -> None:
        """As Dynamo's SGLang worker does: the first real request on any DP rank must not pay
        for compilation and allocation."""
        port = int(engine.server_args.disaggregation_bootstrap_port)
        ranks = dp_layout(_engine_module().resolved_server_args(engine))[0]
        await _engine_module().warmup_prefill(engine, port, ranks)

    def abort_process_requests(self, engine: Any, prefix: str) -> None:
        _engine_module().abort_process_requests(engine, prefix)

    def end_orphaned_requests(self, engine: Any, message: str) -> int:
        return _engine_module().end_orphaned_requests(engine, message)

    def requests_in_flight(self, engine: Any) -> int | None:
        return sglang_compat.sglang_requests_in_flight(engine)

    def tracked_rids(self, engine: Any) -> list[str] | None:
        return sglang_compat.sglang_tracked_rids(engine)

    def scheduler_requests(self, engine: Any) -> int | None:
        return sglang_compat.sglang_scheduler_requests(engine)

    def kv_event_dp_ranks(self, engine: Any) -> range:
        return local_dp_ranks(_engine_module().resolved_server_args(engine))

    def kv_used_blocks(self, engine: Any, page_size: int) -> dict[int, int] | None:
        loads = sglang_compat.sglang_load_snapshots(engine)
        if loads is None:
            return None
        return {int(load.dp_rank): blocks(int(load.num_used_tokens), page_size) for load in loads}

    def kv_load(self, engine: Any, page_size: int) -> list[KvLoad] | None:
        """From the schedulers' load snapshots: 1.6.1 reports `token_usage` as the cache
        usage and the pool in blocks; SGLang's `cache_hit_rate` is its recent batches'."""
        loads = sglang_compat.sglang_load_snapshots(engine)
        if loads is None:
            return None
        return [KvLoad(dp_rank=int(load.dp_rank),
                       total_blocks=blocks(int(load.max_total_num_tokens), page_size),
                       usage=float(load.token_usage), hit_rate=float(load.cache_hit_rate))
                for load in loads]
