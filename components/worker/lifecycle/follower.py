"""A node other than the first of an engine spread over several nodes (SGLang `--nnodes N
--node-rank R`, R >= 1), as Dynamo 1.6.1's worker runs one (`init_llm.py`,
`publisher.handle_non_leader_node`): its schedulers serve the first node's engine, which alone
takes requests and registers. This node registers and serves nothing; with attention DP over
the nodes it relays its own DP ranks' KV events under the first node's instance id (found by
the engine's group id in the model card's runtime data); then it keeps the engine up until
stopped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from components.backends.node import WORKER_GROUP_ID_KEY
from components.worker.flags.config import WorkerConfig
from components.worker.metrics.kv_events import KvPublishing, kv_events_enabled, role_publishes
from components.worker.lifecycle.register import local_indexer

logger = logging.getLogger(__name__)


async def follow(runtime: Any, config: WorkerConfig, engine: Any) -> None:
    """Runs until cancelled (the stop signal)."""
    logger.info("node %d of a multi-node engine: its schedulers serve the first node's "
                "engine, which registers and takes the requests", config.node.rank)
    publishing = KvPublishing()
    try:
        if relays_kv_events(config):
            endpoint = runtime.endpoint(config.dynamo.endpoint)
            first = await first_node_instance(endpoint, config)
            if first is not None:
                publishing.relay_events(endpoint, config.backend, engine,
                                        config.backend.kv_block_size(engine),
                                        config.kv_events_config, local_indexer(config.role),
                                        worker_id=first)
        await asyncio.Event().wait()
    finally:
        publishing.close()


def relays_kv_events(config: WorkerConfig) -> bool:
    if not (kv_events_enabled(config.kv_events_config) and role_publishes(config.role)):
        return False
    if not config.node.relays_kv_events:
        logger.info("node %d shares the first node's KV rank (no attention DP over the "
                    "nodes): the first node alone relays its KV events", config.node.rank)
        return False
    return True


async def first_node_instance(endpoint: Any, config: WorkerConfig) -> int | None:
    """The first node's instance id: by the group id it registers (bounded by SGLang's
    --dist-timeout, as 1.6.1); without one, the endpoint's only instance, else None."""
    client = await endpoint.client()
    group = config.node.group_id
    if group is not None:
        logger.info("waiting for the first node's instance (%s=%s)", WORKER_GROUP_ID_KEY, group)
        try:
            found = await client.wait_for_instance_by_runtime_data(
                WORKER_GROUP_ID_KEY, group, timeout_s=config.node.lookup_timeout_s)
        except Exception as exc:  # the runtime raises bare Exceptions
            raise SystemExit(f"node {config.node.rank}: the first node's instance "
                             f"({WORKER_GROUP_ID_KEY}={group}) was not found: {exc} "
                             "(--dist-init-addr, --dist-timeout)") from None
        return int(found)
    instances = await client.wait_for_instances()
    if len(instances) == 1:
        return int(instances[0])
    logger.warning("node %d: %d instances on %s and no --dist-init-addr to tell the first "
                   "node's: its KV events are not relayed", config.node.rank, len(instances),
                   config.dynamo.endpoint)
    return None
