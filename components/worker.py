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

from dynamo.runtime import DistributedRuntime

from components.args import WorkerConfig, WorkerMode, parse_args
from components.debug_routes import register_debug_routes
from components.engine_factory import build_engine, engine_limits
from components.handler_factory import build_handler, health_check_payload
from components.hosts import is_wildcard
from components.kv_publishing import KvPublishing, kv_events_enabled
from components.register import register_served_model, unregister_served_model
from components.runtime_adapter import RuntimePrefillClient, translate_errors
from components.signal_guard import SignalGuard

logger = logging.getLogger(__name__)

def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def bind_runtime_to_host(host: str) -> None:
    """Keep Dynamo's request-plane listener and system server on the configured host
    (loopback by default) unless the environment already says otherwise."""
    if not is_wildcard(host):
        os.environ.setdefault("DYN_TCP_RPC_HOST", host)
        os.environ.setdefault("DYN_SYSTEM_HOST", host)


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
    return enabled and config.mode is WorkerMode.AGGREGATED


class Worker:
    def __init__(self, config: WorkerConfig, runtime: Any, engine: Any) -> None:
        self.config = config
        self.runtime = runtime
        self.engine = engine
        self.endpoint = runtime.endpoint(config.dynamo.endpoint)
        self.registered = False
        self._stopping = False
        self.kv_publishing = KvPublishing()

    async def serve(self, handler: Any) -> None:
        """Serve the endpoint and, for agg/decode, register the model concurrently."""
        serving = asyncio.ensure_future(self.endpoint.serve_endpoint(
            translate_errors(handler.generate),
            graceful_shutdown=True,
            health_check_payload=health_check_payload(self.config, self.engine),
        ))
        try:
            if self.config.mode is not WorkerMode.PREFILL:
                limits = engine_limits(self.config.engine_kind, self.engine)
                kv_events = publishes_kv_events(self.config)
                if kv_events:
                    await self.kv_publishing.start(self.endpoint, self.config.engine_kind,
                                                   self.engine, limits.page_size,
                                                   self.config.kv_events_config)
                await register_served_model(self.endpoint, self.config, limits, kv_events)
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


async def run_worker(config: WorkerConfig) -> None:
    bind_runtime_to_host(config.host)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, config.dynamo.discovery_backend,
                                 config.dynamo.request_plane)
    if config.dynamo.migration_limit > 0:
        logger.warning("--migration-limit is a frontend setting in Dynamo 1.6.1; "
                       "pass it to dynamo.frontend")
    logger.info("starting %s engine (%s) for %s", config.engine_kind, config.mode.value,
                config.served_model_name)
    engine = build_engine(config.engine_kind, config.engine_args)
    handler = worker = None
    try:
        prefill = None
        if config.mode is WorkerMode.DECODE:
            prefill = await connect_prefill(runtime, config)
        handler = build_handler(config, engine, prefill)
        if config.dynamo.debug_routes:
            register_debug_routes(runtime, engine)
        worker = Worker(config, runtime, engine)
        SignalGuard(loop).take(lambda: asyncio.ensure_future(worker.stop()))
        if config.mode is WorkerMode.PREFILL:
            await warmup_prefill(config, engine)
        await worker.serve(handler)
    finally:
        if worker is not None:
            worker.kv_publishing.close()
        if handler is not None:
            await handler.cleanup()
        engine.shutdown()
        logger.info("worker stopped")


def main(argv: list[str] | None = None) -> None:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(config.log_level)
    asyncio.run(run_worker(config))
    # Everything is drained and shut down. Skip interpreter finalization: Dynamo's runtime
    # threads (health-check canaries) can still be entering Python, and finalization then
    # aborts the process ("FATAL: exception not rethrown", SIGABRT) instead of exiting 0.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
