"""SGLang's multi-node layout (`--nnodes`, `--node-rank`, `--dist-init-addr`) as Dynamo 1.6.1's
worker reads it (`dynamo/sglang/_disagg.py`, `capacity.py`): which node this is, the group id
its nodes share, whether it relays KV events, and where a decode dials the bootstrap server."""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang.srt.utils.network import NetworkAddress

from components.backends.node import EngineNode
from components.backends.sglang import dp_layout

logger = logging.getLogger(__name__)


def engine_node(server_args: Any) -> EngineNode:
    rank = int(getattr(server_args, "node_rank", 0) or 0)
    nnodes = int(getattr(server_args, "nnodes", 1) or 1)
    dp_size, attention_dp = dp_layout(server_args)
    timeout = getattr(server_args, "dist_timeout", None)
    return EngineNode(
        rank=rank, group_id=_group_id(server_args) if nnodes > 1 else None,
        # Pure DP is single-node in SGLang; without attention DP every node shares the first
        # node's one rank, which only the first node relays.
        relays_kv_events=(attention_dp and dp_size > 1) or not (nnodes > 1 and rank > 0),
        lookup_timeout_s=None if timeout is None else float(timeout),
    )


def _group_id(server_args: Any) -> Optional[str]:
    address = getattr(server_args, "dist_init_addr", None)
    if not address:
        logger.warning("--nnodes > 1 without --dist-init-addr: the nodes share no group id")
        return None
    try:
        return f"dist_init:{NetworkAddress.parse(str(address).strip()).resolved().to_tcp()}"
    except ValueError as exc:
        logger.warning("--dist-init-addr %r gives no group id: %s", address, exc)
        return None


def dist_init_host(server_args: Any) -> Optional[str]:
    """The host of `--dist-init-addr` (resolved; an IPv6 one bracketed), where the first node
    runs, so where its bootstrap server is dialled; None without the flag. Dynamo 1.6.1's
    `compute_bootstrap_address` takes it before this machine's own address."""
    address = getattr(server_args, "dist_init_addr", None)
    if not address:
        return None
    try:
        resolved = NetworkAddress.parse(str(address).strip()).resolved()
    except ValueError as exc:
        raise SystemExit(f"--dist-init-addr {address!r}: {exc}") from None
    return NetworkAddress(resolved.host, 0).to_host_port_str().rsplit(":", 1)[0]
