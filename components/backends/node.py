"""Where a worker's engine sits in an engine spread over several nodes (SGLang's `--nnodes`):
read from the engine's flags once, without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The runtime-data key (model card, engine-specific) under which the first node advertises its
# engine's group id, and by which the other nodes find its instance: Dynamo 1.6.1's
# `SGLANG_WORKER_GROUP_ID_KEY` (dynamo/sglang/_disagg.py).
WORKER_GROUP_ID_KEY = "sglang_worker_group_id"


@dataclass(frozen=True)
class EngineNode:
    rank: int = 0  # --node-rank
    # Shared by every node of one engine (Dynamo 1.6.1's `dist_init:<host:port>`, from
    # --dist-init-addr); None on a single node, or where it cannot be derived.
    group_id: Optional[str] = None
    # Whether this node relays its own DP ranks' KV events (Dynamo 1.6.1's
    # `capacity.publishes_kv_events`): the first node always; another only with attention
    # DP over the nodes, which gives each node distinct ranks.
    relays_kv_events: bool = True
    # Bound on a later node's wait for the first node's instance (SGLang's --dist-timeout, as
    # 1.6.1 uses it); None: unbounded.
    lookup_timeout_s: Optional[float] = None

    @property
    def first(self) -> bool:
        """The node that serves and registers; the others only run schedulers of its engine."""
        return self.rank == 0
