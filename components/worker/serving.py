"""The serving worker: serve the endpoint, register the model, and stop as Dynamo's workers
stop (components/worker/lifecycle/shutdown.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dynamo.common.utils.graceful_shutdown import get_grace_period_seconds

from components.worker.flags.config import WorkerConfig
from components.worker.handler_factory import bootstrap_endpoint, health_check_payload
from components.worker.metrics.kv_events import KvPublishing, kv_events_enabled, role_publishes
from components.worker.metrics.metrics_export import expose_metrics
from components.worker.metrics.worker_metrics import WorkerMetrics
from components.worker.lifecycle.register import (local_indexer, register_served_model,
                                                  unregister_served_model)
from components.worker.lifecycle.endpoint import endpoint
from components.worker.lifecycle.shutdown import drain, settle
from components.worker.lifecycle.tokenizer_workers import engine_pid
from handlers.core.live import LiveRequests

logger = logging.getLogger(__name__)

REGISTRATION_WAIT_S = 30.0  # for a registration under way when a stop signal comes


def publishes_kv_events(config: WorkerConfig) -> bool:
    """With --kv-events-config, the workers a KV router reads: aggregated ones and
    frontend-orchestrated prefill ones (components/worker/metrics/kv_events.py,
    `role_publishes`)."""
    enabled = kv_events_enabled(config.kv_events_config) and role_publishes(config.role)
    # With --tokenizer-worker-num the engine process publishes for its engine; the attached
    # processes have no engine of their own to listen to.
    return enabled and engine_pid() is None


class Worker:
    def __init__(self, config: WorkerConfig, runtime: Any, engine: Any,
                 metrics: WorkerMetrics | None = None, live: LiveRequests | None = None) -> None:
        self.config = config
        self.runtime = runtime
        self.engine = engine
        self.metrics = metrics or WorkerMetrics(engine)
        # The handler's requests, ended when the drain time runs out.
        self.live = live if live is not None else LiveRequests()
        self.endpoint = runtime.endpoint(config.dynamo.endpoint)
        self.registered = False
        self.ready = False  # registered (where the role registers), and not stopping
        self._registration: asyncio.Future[None] | None = None
        self.serving: asyncio.Future[Any] | None = None
        self._stopping = False
        self._orphaned = asyncio.Event()
        self.kv_publishing = KvPublishing()

    def expose_metrics(self, load_seconds: float | None = None) -> None:
        """The worker's metrics on the system port's /metrics, with Dynamo's labels
        (components/worker/metrics/metrics_export.py)."""
        expose_metrics(self.endpoint, self.config, self.engine, self.metrics, load_seconds)

    async def serve(self, handler: Any) -> None:
        """Serve the endpoint and register the model concurrently (every role but a
        decode-orchestrated prefill, which serves a private endpoint)."""
        serving = self.serving = asyncio.ensure_future(self.endpoint.serve_endpoint(
            endpoint(handler.generate, self.metrics, self.config.role.streams_tokens),
            graceful_shutdown=True,
            health_check_payload=health_check_payload(self.config, self.engine),
        ))
        try:
            if self.config.role.registers:
                self._registration = asyncio.ensure_future(self._register())
                await self._registration
            if self._stopping:  # a signal while the model registered: stop() undid it
                logger.info("stopped during startup: nothing was served")
            else:
                self.ready = True
                logger.info("worker ready: %s serving %s", self.config.role.mode.value,
                            self.config.dynamo.endpoint)
            await serving
        except asyncio.CancelledError:
            if not self._stop_gave_up():
                self.runtime.shutdown()
                raise
        except BaseException:
            # A failed registration must not leave a half-served endpoint behind.
            self.runtime.shutdown()
            raise

    def _stop_gave_up(self) -> bool:
        """The stop cancelled the serving (its drain ran out) or the registration (too slow)."""
        registration = self._registration
        return self._stopping and (self.serving.cancelled() or (
            registration is not None and registration.cancelled()))

    async def _register(self) -> None:
        limits = self.config.backend.limits(self.engine)
        bootstrap = (bootstrap_endpoint(self.config, self.engine)
                     if self.config.role.prefill else None)
        kv_events = publishes_kv_events(self.config)
        if kv_events:
            await self.kv_publishing.start(self.endpoint, self.config.backend, self.engine,
                                           limits.page_size, self.config.kv_events_config,
                                           local_indexer(self.config.role), limits.kv_block_size)
        await register_served_model(self.endpoint, self.config, limits, bootstrap, kv_events)
        self.registered = True

    def orphan(self, reason: str = "the engine process exited") -> None:
        """The engine's process (an attached process's engine process, or a subprocess of the
        engine) exited: no output will come for the requests it holds, so end them now (a 503)
        rather than at the drain's end."""
        count = self.config.backend.end_orphaned_requests(self.engine, reason)
        logger.error("%s: ended %d request(s)", reason, count)
        self._orphaned.set()

    async def stop(self) -> None:
        """Signal path, as Dynamo's workers stop: leave discovery first, serve on through the
        grace period (cut short if the engine is gone), then stop taking requests and drain
        those in flight (bounded)."""
        if self._stopping:
            return
        self._stopping = True
        logger.info("shutting down: unregistering %s", self.config.dynamo.endpoint)
        await self._registered_or_cancelled()
        if self.registered:
            # Removes the model card and this endpoint instance (observed with 1.6.1).
            await unregister_served_model(self.endpoint)
        else:
            try:
                await self.endpoint.unregister_endpoint_instance()
            except Exception as exc:  # runtime errors are bare Exceptions; shutdown goes on
                logger.warning("unregistering the endpoint instance failed: %s", exc)
        grace = get_grace_period_seconds()  # Dynamo's DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS
        if grace > 0 and self.ready and not self._orphaned.is_set():  # routers knew it
            logger.info("serving on for the %.1f s grace period", grace)
            try:
                await asyncio.wait_for(self._orphaned.wait(), grace)
            except asyncio.TimeoutError:
                pass
        self.runtime.shutdown()
        if self.serving is not None:
            await drain(self.serving, self.live, self.config.drain_timeout)
        if self.config.role.prefill and not self._orphaned.is_set():
            await settle(self.live)

    async def _registered_or_cancelled(self) -> None:
        """A signal while the model registers: let the registration finish (bounded), so the
        stop undoes all of it, rather than leave a model card that a late registration wrote
        after the stop had unregistered."""
        if self._registration is None or self._registration.done():
            return
        done, _ = await asyncio.wait({self._registration}, timeout=REGISTRATION_WAIT_S)
        if not done:
            logger.warning("the model's registration took over %g s; stopping without it",
                           REGISTRATION_WAIT_S)
            self._registration.cancel()
