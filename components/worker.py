"""The worker process: parse -> runtime -> engine -> handler -> serve (+ register).

`python -m components ...` runs one worker in one of three roles, picked by SGLang's
`--disaggregation-mode`: agg (`null`), prefill or decode. On SIGTERM/SIGINT (owned by the worker
even after SGLang tries to install its own handler) it unregisters, lets in-flight requests finish (the endpoint is served with graceful_shutdown), shuts the
engine down and exits 0. Startup failures (bad flags, model load, registration) exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from dynamo.common.utils.prometheus import register_engine_metrics_callback
from dynamo.runtime import DistributedRuntime

from components.args import WorkerConfig, WorkerMode, parse_args
from components.debug_routes import register_debug_routes
from components.engine_factory import attach_engine, build_engine, engine_limits
from components.handler_factory import bootstrap_endpoint, build_handler, health_check_payload
from components.hosts import is_wildcard
from components.kv_publishing import KvPublishing, kv_events_enabled
from components.loop_lag import LoopLagMonitor
from components.metrics import WorkerMetrics
from components.register import register_served_model, role_for, unregister_served_model
from components.room_wiring import room_claims, start_room_watch
from components.runtime_adapter import RuntimePrefillClient, translate_errors
from components.signal_guard import SignalGuard
from components.tokenizer_workers import TokenizerWorkers, engine_pid, exit_with_engine, worker_count

logger = logging.getLogger(__name__)

def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def bind_runtime_to_host(host: str) -> None:
    """Keep Dynamo's request-plane listener, system server and response-stream server (where a
    decode worker receives its prefill's answers) on the configured host (loopback by default)
    unless the environment already says otherwise."""
    if not is_wildcard(host):
        os.environ.setdefault("DYN_TCP_RPC_HOST", host)
        os.environ.setdefault("DYN_SYSTEM_HOST", host)
        os.environ.setdefault("DYN_TCP_RESPONSE_STREAM_HOST", host)


async def connect_prefill(runtime: Any, config: WorkerConfig) -> RuntimePrefillClient:
    """Decode only: a client for the prefill endpoint, once an instance is listed (bounded)."""
    client = await runtime.endpoint(config.dynamo.prefill_endpoint).client()
    prefill = RuntimePrefillClient(client)
    timeout = config.dynamo.prefill_instance_timeout
    logger.info("waiting up to %.0fs for a prefill instance on %s",
                timeout, config.dynamo.prefill_endpoint)
    try:
        ids = await prefill.wait_for_instance(timeout)
    except asyncio.TimeoutError:
        raise SystemExit(f"no prefill worker appeared on {config.dynamo.prefill_endpoint} "
                         f"within {timeout:.0f}s") from None
    logger.info("prefill instances: %s", [f"{i:x}" for i in ids])
    return prefill


async def warmup_prefill(config: WorkerConfig, engine: Any) -> None:
    """SGLang prefill engines take one request through the prefill path before serving, as
    Dynamo's do; the CPU engine has nothing to compile or allocate lazily."""
    if config.engine_kind != "sglang":
        return
    from components.sglang_engine import warmup_prefill as sglang_warmup

    await sglang_warmup(engine, int(engine.server_args.disaggregation_bootstrap_port))


def publishes_kv_events(config: WorkerConfig) -> bool:
    """Aggregated workers with --kv-events-config: decode engines keep no prefix cache and
    prefill workers register no model (components/kv_publishing.py)."""
    enabled = kv_events_enabled(config.kv_events_config)
    if enabled and config.mode is not WorkerMode.AGGREGATED:
        logger.warning("--kv-events-config: only aggregated workers publish KV events")
    # With --tokenizer-worker-num the engine process publishes for its engine; the attached
    # processes have no engine of their own to listen to.
    return enabled and config.mode is WorkerMode.AGGREGATED and engine_pid() is None


class Worker:
    def __init__(self, config: WorkerConfig, runtime: Any, engine: Any,
                 metrics: WorkerMetrics | None = None) -> None:
        self.config = config
        self.runtime = runtime
        self.engine = engine
        self.metrics = metrics or WorkerMetrics(engine)
        self.endpoint = runtime.endpoint(config.dynamo.endpoint)
        self.registered = False
        self._stopping = False
        self.kv_publishing = KvPublishing()

    def expose_metrics(self) -> None:
        """The worker's metrics on the system port's /metrics, with Dynamo's labels
        (components/metrics.py)."""
        namespace, component, endpoint = self.config.dynamo.endpoint.split(".")
        register_engine_metrics_callback(
            self.endpoint, self.metrics.registry, namespace_name=namespace,
            component_name=component, endpoint_name=endpoint,
            model_name=self.config.served_model_name)

    async def serve(self, handler: Any) -> None:
        """Serve the endpoint and register the model concurrently (every role but a
        decode-orchestrated prefill, which serves a private endpoint)."""
        serving = asyncio.ensure_future(self.endpoint.serve_endpoint(
            translate_errors(self.metrics.instrument(
                handler.generate, streams_tokens=self.config.mode is not WorkerMode.PREFILL)),
            graceful_shutdown=True,
            health_check_payload=health_check_payload(self.config, self.engine),
        ))
        try:
            if role_for(self.config) is not None:
                limits = engine_limits(self.config.engine_kind, self.engine)
                bootstrap = (bootstrap_endpoint(self.config, self.engine)
                             if self.config.mode is WorkerMode.PREFILL else None)
                kv_events = publishes_kv_events(self.config)
                if kv_events:
                    await self.kv_publishing.start(self.endpoint, self.config.engine_kind,
                                                   self.engine, limits.page_size,
                                                   self.config.kv_events_config)
                await register_served_model(self.endpoint, self.config, limits, bootstrap,
                                            kv_events)
                self.registered = True
            logger.info("worker ready: %s serving %s", self.config.mode.value,
                        self.config.dynamo.endpoint)
            await serving
        except BaseException:
            # A failed registration must not leave a half-served endpoint behind.
            self.runtime.shutdown()
            raise

    async def stop(self) -> None:
        """Signal path: leave discovery first so no new requests arrive, then let the
        runtime drain in-flight ones (serve_endpoint returns when they are done)."""
        if self._stopping:
            return
        self._stopping = True
        logger.info("shutting down: unregistering %s", self.config.dynamo.endpoint)
        if self.registered:
            # Removes the model card and this endpoint instance (observed with 1.6.1).
            await unregister_served_model(self.endpoint)
        else:
            try:
                await self.endpoint.unregister_endpoint_instance()
            except Exception as exc:  # runtime errors are bare Exceptions; shutdown goes on
                logger.warning("unregistering the endpoint instance failed: %s", exc)
        self.runtime.shutdown()


def start_engine(config: WorkerConfig, argv: list[str]) -> tuple[Any, TokenizerWorkers | None]:
    """The engine, or an attachment to the engine process's; with --tokenizer-worker-num N > 1
    the engine process also starts the N - 1 attached ones (`components.tokenizer_workers`)."""
    parent = engine_pid()
    if parent is not None:
        exit_with_engine()
        return attach_engine(config.engine_kind, parent), None
    engine = build_engine(config.engine_kind, config.engine_args)
    count = worker_count(config.engine_kind, config.engine_args)
    return engine, (TokenizerWorkers.start(count, argv) if count > 1 else None)


async def run_worker(config: WorkerConfig, argv: list[str] | None = None) -> None:
    bind_runtime_to_host(config.host)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, config.dynamo.discovery_backend,
                                 config.dynamo.request_plane)
    if config.dynamo.migration_limit > 0:
        logger.warning("--migration-limit is a frontend setting in Dynamo 1.6.1; "
                       "pass it to dynamo.frontend")
    logger.info("starting %s engine (%s) for %s", config.engine_kind, config.mode.value,
                config.served_model_name)
    engine, workers = start_engine(config, sys.argv[1:] if argv is None else argv)
    handler = worker = lag = rooms = None
    try:
        prefill = None
        if config.mode is WorkerMode.DECODE and not config.dynamo.frontend_orchestrated:
            prefill = await connect_prefill(runtime, config)
        elif config.mode is WorkerMode.DECODE:
            rooms = await room_claims(runtime, config)
        elif config.mode is WorkerMode.PREFILL:
            rooms = await start_room_watch(runtime, config, bootstrap_endpoint(config, engine))
        metrics = WorkerMetrics(engine)
        lag = LoopLagMonitor(metrics.loop_lag.observe)
        lag.start()
        handler = build_handler(config, engine, prefill, metrics, rooms)
        if config.dynamo.debug_routes:
            register_debug_routes(runtime, engine)
        worker = Worker(config, runtime, engine, metrics)
        worker.expose_metrics()
        SignalGuard(loop).take(lambda: _stop_all(worker, workers))
        if config.mode is WorkerMode.PREFILL:
            await warmup_prefill(config, engine)
        await worker.serve(handler)
    finally:
        if lag is not None:
            await lag.stop()
        if worker is not None:
            worker.kv_publishing.close()
        if handler is not None:
            await handler.cleanup()
        if rooms is not None:
            await rooms.close()
        if workers is not None:  # they drain on this process's engine: stop them first
            await asyncio.to_thread(workers.stop)
        engine.shutdown()
        logger.info("worker stopped")


def _stop_all(worker: Worker, workers: TokenizerWorkers | None) -> None:
    if workers is not None:
        workers.terminate()
    asyncio.ensure_future(worker.stop())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    config = parse_args(argv)
    configure_logging(config.log_level)
    asyncio.run(run_worker(config, argv))
    # Everything is drained and shut down. Skip interpreter finalization: Dynamo's runtime
    # threads (health-check canaries) can still be entering Python, and finalization then
    # aborts the process ("FATAL: exception not rethrown", SIGABRT) instead of exiting 0.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
