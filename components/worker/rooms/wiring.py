"""The room watch in the worker process (docs/reference/room-watch.md): the prefill
worker's server and its `room_watch` endpoint, the decode worker's claims. Both styles:
decode-orchestrated, the decode also stops the prefill's stream itself, but Dynamo 1.6.1's
runtime loses that stop when the decode gives up while the prefill's response stream is still
connecting (the decode logs "Subject not found"), and the prefill then held its KV until its
engine's bootstrap timeout.

With --tokenizer-worker-num every decode process claims; on a prefill worker the engine's own
process watches, and legs that land in an attached process are not watched (attached processes
gain nothing on a prefill worker, whose requests come tokenized).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from components.worker.flags.config import WorkerConfig
from components.worker.hosts import advertised_host
from components.worker.rooms.claims import RoomClaims
from components.worker.rooms.directory import RoomDirectory, room_watch_answer, room_watch_endpoint
from components.worker.rooms.kv_probe import KVPathProbe, engine_prober
from components.worker.rooms.watch import RoomWatchServer
from components.worker.lifecycle.tokenizer_workers import engine_pid

logger = logging.getLogger(__name__)


def kv_path_probe(config: WorkerConfig, engine: Any,
                  rooms: Optional[RoomClaims]) -> Optional[KVPathProbe]:
    """Decode: the probe its handler asks before a request uses a prefill's room, on an engine
    whose transport does not check its own path (SGLang's NIXL connection; the CPU engine's
    side channel probes). DYN_KV_PATH_PROBE=0 turns either off; a prefill answers probes
    regardless, so the switch on one side never breaks a pair."""
    from components.engine.disagg.transport.path_probe import probe_enabled

    if rooms is None or config.backend.probes_own_kv_path or not probe_enabled():
        return None
    return KVPathProbe(engine, rooms)


async def start_room_watch(runtime: Any, config: WorkerConfig, bootstrap: tuple[str, int],
                           engine: Any) -> Optional[RoomWatchServer]:
    """Prefill: listen on the configured host (at --room-watch-port, a fixed port a firewall
    between nodes can open; 0: a free one) and say where on `<component>.room_watch`; run the
    prefill's half of each KV path probe a decode asks for."""
    if not config.role.prefill or engine_pid() is not None:
        return None
    port = config.dynamo.room_watch_port
    server = RoomWatchServer(config.host, port, claim_timeout_s=config.dynamo.room_claim_timeout)
    try:
        await server.start()
    except RuntimeError as exc:
        raise SystemExit(f"--room-watch-port {port}: {exc}") from None
    if not config.backend.probes_own_kv_path:
        server.prober = engine_prober(engine, bootstrap)
    watch = (advertised_host(config.host, config.backend), server.port)
    endpoint = runtime.endpoint(room_watch_endpoint(config.dynamo.endpoint))
    serving = asyncio.ensure_future(endpoint.serve_endpoint(room_watch_answer(bootstrap, watch)))
    serving.add_done_callback(_log_end)
    return server


async def room_claims(runtime: Any, config: WorkerConfig) -> Optional[RoomClaims]:
    """Decode: claims at the prefill workers' watches, found through their endpoint."""
    if not config.role.claims_rooms:
        return None
    client = await runtime.endpoint(room_watch_endpoint(config.dynamo.prefill_endpoint)).client()
    return RoomClaims(RoomDirectory(client).lookup)


def _log_end(serving: "asyncio.Future[Any]") -> None:
    if not serving.cancelled() and serving.exception() is not None:
        logger.error("the room_watch endpoint stopped: %r", serving.exception())
