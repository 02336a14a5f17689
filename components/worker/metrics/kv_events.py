"""KV events and load for Dynamo's KV router (`dynamo.frontend --router-mode kv`).

On with SGLang's `--kv-events-config` (a JSON object whose `publisher` is not "null"), as in
Dynamo's own SGLang worker, which also marks the model card `kv_event_publishing_enabled`:
- `--engine sglang`: each DP rank's scheduler publishes BlockStored/BlockRemoved on the ZMQ
  `endpoint` of that config, its port offset by the rank (`sglang_zmq_endpoints`); one
  `KvEventPublisher` per local rank subscribes there and relays to Dynamo's event plane with that
  `dp_rank` (Dynamo's `dynamo.sglang.publisher` does the same); the schedulers' load (KV blocks
  in use per DP rank) goes to a `WorkerMetricsPublisher` (load_relay.py).
- CPU engine: the engine reports its prefix cache's blocks and its load in-process
  (`components/engine/kv/events.py`), and `EngineKvRelay` hands them to a `KvEventPublisher`
  (manual mode, DP rank 0) and a `WorkerMetricsPublisher`. The `endpoint` is not used.
Block size is the engine's page size (SGLang with `--dcp-size`: page size x DCP size, the pages its
radix tree keeps, as 1.6.1 registers). Who publishes (`role_publishes`): the workers a KV router
reads, i.e. aggregated workers, with the frontend orchestrating, prefill workers (the
frontend's prefill router picks a prefill worker by its cached blocks, as it does for 1.6.1's),
and decode workers with a prefix cache that call their prefill themselves (the frontend sees an
aggregated worker and sends a conversation's next turn to the decode that holds its history).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any
from urllib.parse import urlparse

from dynamo.llm import KvEventPublisher, WorkerMetricsPublisher

from components.backends.base import EngineBackend
from components.worker.metrics.load_relay import LoadRelay
from components.worker.role import WorkerRole

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0


def kv_events_enabled(kv_events_config: str | None) -> bool:
    """SGLang's rule (and Dynamo's `use_kv_events`): a config whose publisher is not "null"."""
    if not kv_events_config:
        return False
    try:
        cfg = json.loads(kv_events_config)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--kv-events-config must be a JSON object: {exc}") from None
    if not isinstance(cfg, dict):
        raise SystemExit("--kv-events-config must be a JSON object")
    return cfg.get("publisher", "null") != "null"


def role_reads_by_router(role: WorkerRole) -> bool:
    """The roles a KV router reads: aggregated, prefill with the frontend orchestrating, and a
    decode with a prefix cache that orchestrates its prefill (it registers as an aggregated
    worker, so the frontend's KV router sends a conversation's next turn where its KV is)."""
    return (role.aggregated or (role.prefill and role.frontend_orchestrated)
            or (role.decode_cache and role.calls_prefill))


def role_publishes(role: WorkerRole) -> bool:
    """Whether a worker of `role` publishes (given --kv-events-config); logs why not."""
    if role_reads_by_router(role):
        return True
    if role.decode and role.decode_cache:
        # Dynamo 1.6.1's frontend picks the decode of a request it orchestrates by load alone
        # (its decode router reads KV events only with --router-conditional-disagg, which sends
        # some requests to the decode without a prefill: not served here).
        logger.warning("--kv-events-config: the frontend picks decode workers by load, not by "
                       "KV events: a frontend-orchestrated decode publishes none")
    elif role.decode:
        # Every page of a disaggregated request arrives from its prefill, whose cache serves
        # repeated prefixes: without --disaggregation-decode-enable-radix-cache a decode engine
        # (SGLang's or the CPU engine) keeps no prefix cache.
        logger.warning("--kv-events-config: decode workers without "
                       "--disaggregation-decode-enable-radix-cache keep no prefix cache and "
                       "publish no KV events")
    else:
        logger.warning("--kv-events-config: a decode-orchestrated prefill worker registers no "
                       "model, so no KV router reads it; it publishes no KV events")
    return False


class EngineKvRelay:
    """The CPU engine's KvEventListener. The engine thread only enqueues; one publisher thread
    calls Dynamo's bindings in order (as Dynamo's own sample engine does), so a slow or failing
    publish never stalls or fails an engine step."""

    def __init__(self, events: KvEventPublisher, metrics: WorkerMetricsPublisher,
                 page_size: int) -> None:
        self._events = events
        self._metrics = metrics
        self._page = page_size
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher",
                                        daemon=True)
        self._thread.start()

    def blocks_stored(self, token_ids: list[int], block_hashes: list[int],
                      parent_hash: int | None) -> None:
        self._queue.put((self._events.publish_stored, (
            token_ids, [self._page] * len(block_hashes), block_hashes, parent_hash), {}))

    def blocks_removed(self, block_hashes: list[int]) -> None:
        self._queue.put((self._events.publish_removed, (block_hashes,), {}))

    def load(self, kv_used_pages: int, running: int, waiting: int) -> None:
        self._queue.put((self._metrics.publish, (0,), {"kv_used_blocks": kv_used_pages}))

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Publish what is queued, then stop the thread (bounded)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            publish, args, kwargs = item
            # A router that misses an event routes worse; nothing else depends on it. The
            # bindings raise bare Exceptions.
            try:
                publish(*args, **kwargs)
            except Exception as exc:
                logger.warning("publishing a KV event for the router failed: %s", exc)


def sglang_zmq_endpoints(kv_events_config: str, dp_ranks: range) -> list[tuple[int, str]]:
    """(DP rank, where its scheduler publishes) for each rank. SGLang's rule
    (`ZmqEventPublisher.offset_endpoint_port`, which 1.6.1's subscriber calls too): rank r binds
    the config's `endpoint` with its port + r. A wildcard host is reached on loopback (SGLang
    binds wildcards on IPv4 only; Dynamo connects the same way)."""
    endpoint = json.loads(kv_events_config).get("endpoint")
    if not endpoint:
        raise SystemExit("--kv-events-config is set but has no 'endpoint': give the "
                         "tcp://host:port SGLang's schedulers publish on (e.g. tcp://*:5557); "
                         "Dynamo 1.6.1 requires it too")
    parsed = urlparse(endpoint)
    if parsed.scheme != "tcp" or parsed.port is None:
        raise SystemExit(f"--kv-events-config endpoint must be tcp://host:port, got {endpoint!r}")
    host = "127.0.0.1" if parsed.hostname in ("*", "0.0.0.0", "::") else parsed.hostname
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return [(rank, f"tcp://{host}:{parsed.port + rank}") for rank in dp_ranks]


def check_kv_events_config(kv_events_config: str | None, over_zmq: bool,
                           role: WorkerRole) -> None:
    """At parse time, not after the model load: a config the relay of a publishing role cannot
    follow (no or a malformed `endpoint` where the engine publishes over ZMQ) is refused
    naming the flag."""
    if over_zmq and kv_events_enabled(kv_events_config) and role_reads_by_router(role):
        sglang_zmq_endpoints(kv_events_config, range(0))


class KvPublishing:
    """Started after the endpoint exists, before the model is registered; `close` on exit."""

    def __init__(self) -> None:
        self._publishers: list[KvEventPublisher] = []
        self._relay: EngineKvRelay | None = None
        self._load: LoadRelay | None = None

    async def start(self, endpoint: Any, backend: EngineBackend, engine: Any, page_size: int,
                    kv_events_config: str, local_indexer: bool = False,
                    block_size: int | None = None) -> None:
        """`local_indexer`: what the model card advertises (register.local_indexer); the
        publishers then serve the worker-local indexer the router may query, as 1.6.1's do.
        `block_size`: the registered block size, when it is not the page size (SGLang's
        --dcp-size widens its radix tree's pages); the load is still counted in pages."""
        block_size = block_size or page_size
        if backend.kv_events_over_zmq:
            self.relay_events(endpoint, backend, engine, block_size, kv_events_config,
                              local_indexer)
            metrics = await _load_publisher(endpoint)
            self._load = LoadRelay(backend, engine, page_size, metrics)
            self._load.start()
            logger.info("relaying the SGLang schedulers' load too")
            return
        metrics = await _load_publisher(endpoint)
        publisher = KvEventPublisher(endpoint=endpoint, kv_block_size=page_size,
                                     enable_local_indexer=local_indexer)
        self._publishers = [publisher]
        self._relay = EngineKvRelay(publisher, metrics, page_size)
        engine.set_kv_event_listener(self._relay)
        logger.info("publishing the CPU engine's KV events and load (block size %d)", page_size)

    def relay_events(self, endpoint: Any, backend: EngineBackend, engine: Any, block_size: int,
                     kv_events_config: str, local_indexer: bool,
                     worker_id: int | None = None) -> None:
        """One relay per DP rank on this node, from the ZMQ port SGLang gives that rank.
        `worker_id`: the instance the events are attributed to (None: this endpoint's; a
        multi-node engine's later nodes give the first node's)."""
        ranks = sglang_zmq_endpoints(kv_events_config, backend.kv_event_dp_ranks(engine))
        self._publishers = [
            KvEventPublisher(endpoint=endpoint, worker_id=worker_id, kv_block_size=block_size,
                             dp_rank=rank, zmq_endpoint=zmq_endpoint, zmq_topic="",
                             enable_local_indexer=local_indexer)
            for rank, zmq_endpoint in ranks]
        logger.info("relaying SGLang KV events from %s (block size %d)",
                    ", ".join(ep for _, ep in ranks), block_size)

    def close(self) -> None:
        if self._load is not None:
            self._load.close()
            self._load = None
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        for publisher in self._publishers:
            publisher.shutdown()
        self._publishers = []


async def _load_publisher(endpoint: Any) -> WorkerMetricsPublisher:
    """Dynamo's load publisher on the worker's endpoint, starting from an idle engine."""
    metrics = WorkerMetricsPublisher()
    await metrics.create_endpoint(endpoint)
    metrics.publish(0, kv_used_blocks=0)
    return metrics
