"""KV events and load for Dynamo's KV router (`dynamo.frontend --router-mode kv`).

On with SGLang's `--kv-events-config` (a JSON object whose `publisher` is not "null"), as in
Dynamo's own SGLang worker, which also marks the model card `kv_event_publishing_enabled`:
- `--engine sglang`: SGLang's scheduler publishes BlockStored/BlockRemoved on the ZMQ
  `endpoint` of that config; a `KvEventPublisher` subscribes there and relays to Dynamo's event
  plane (Dynamo's `dynamo.sglang.publisher` does the same; one scheduler, DP rank 0); the
  schedulers' load (KV blocks in use per DP rank) goes to a `WorkerMetricsPublisher`
  (load_relay.py).
- CPU engine: the engine reports its prefix cache's blocks and its load in-process
  (`components/engine/kv/events.py`), and `EngineKvRelay` hands them to a `KvEventPublisher`
  (manual mode) and a `WorkerMetricsPublisher`. The `endpoint` in the config is not used.
Block size is the engine's page size. Decode engines keep no prefix cache (docs/architecture.md)
and publish nothing; prefill workers register no model, so no router reads them.
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
from components.worker.load_relay import LoadRelay

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


def sglang_zmq_endpoint(kv_events_config: str) -> str:
    """Where SGLang's scheduler (DP rank 0) publishes: its `endpoint`, a wildcard host reached
    on loopback (SGLang binds wildcards on IPv4 only; Dynamo connects the same way)."""
    endpoint = json.loads(kv_events_config).get("endpoint")
    if not endpoint:
        raise SystemExit("--kv-events-config is set but has no 'endpoint'")
    parsed = urlparse(endpoint)
    if parsed.scheme != "tcp" or parsed.port is None:
        raise SystemExit(f"--kv-events-config endpoint must be tcp://host:port, got {endpoint!r}")
    host = "127.0.0.1" if parsed.hostname in ("*", "0.0.0.0", "::") else parsed.hostname
    return f"tcp://{host}:{parsed.port}"


class KvPublishing:
    """Started after the endpoint exists, before the model is registered; `close` on exit."""

    def __init__(self) -> None:
        self._publisher: KvEventPublisher | None = None
        self._relay: EngineKvRelay | None = None
        self._load: LoadRelay | None = None

    async def start(self, endpoint: Any, backend: EngineBackend, engine: Any, page_size: int,
                    kv_events_config: str, local_indexer: bool = False) -> None:
        """`local_indexer`: what the model card advertises (register.local_indexer); the
        publisher then serves the worker-local indexer the router may query, as 1.6.1's does."""
        if backend.kv_events_over_zmq:
            zmq_endpoint = sglang_zmq_endpoint(kv_events_config)
            self._publisher = KvEventPublisher(endpoint=endpoint, kv_block_size=page_size,
                                               zmq_endpoint=zmq_endpoint, zmq_topic="",
                                               enable_local_indexer=local_indexer)
            metrics = await _load_publisher(endpoint)
            self._load = LoadRelay(backend, engine, page_size, metrics)
            self._load.start()
            logger.info("relaying SGLang KV events from %s and its schedulers' load (block "
                        "size %d)", zmq_endpoint, page_size)
            return
        metrics = await _load_publisher(endpoint)
        self._publisher = KvEventPublisher(endpoint=endpoint, kv_block_size=page_size,
                                           enable_local_indexer=local_indexer)
        self._relay = EngineKvRelay(self._publisher, metrics, page_size)
        engine.set_kv_event_listener(self._relay)
        logger.info("publishing the CPU engine's KV events and load (block size %d)", page_size)

    def close(self) -> None:
        if self._load is not None:
            self._load.close()
            self._load = None
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._publisher is not None:
            self._publisher.shutdown()
            self._publisher = None


async def _load_publisher(endpoint: Any) -> WorkerMetricsPublisher:
    """Dynamo's load publisher on the worker's endpoint, starting from an idle engine."""
    metrics = WorkerMetricsPublisher()
    await metrics.create_endpoint(endpoint)
    metrics.publish(0, kv_used_blocks=0)
    return metrics
