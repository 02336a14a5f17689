"""The worker process: parse -> runtime -> engine -> handler -> serve (+ register).

`python -m components ...` runs one worker in one of three roles, picked by SGLang's
`--disaggregation-mode`: agg (`null`), prefill or decode. SIGTERM/SIGINT (owned by the worker
from its first line, even after SGLang tries to install its own handler) stop it as Dynamo's
workers stop: unregister, a grace period, a bounded drain, engine shutdown, exit 0
(components/worker/lifecycle/shutdown.py); during startup they stop it at once, also exit 0. Startup
failures (bad flags, model load, registration) exit non-zero, and so does a worker whose own engine
process (--cpu-engine-process separate) exited under it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

import uvloop
from dynamo.runtime import DistributedRuntime

from components.worker.flags.config import WorkerConfig, parse_args
from components.worker.flags.config_dump import dump_worker_config
from components.worker.metrics.debug_routes import register_debug_routes
from components.worker.lifecycle.follower import follow
from components.worker.handler_factory import bootstrap_endpoint, build_handler
from components.worker.hosts import is_wildcard
from components.worker.metrics.worker_metrics import WorkerMetrics
from components.worker.rooms.wiring import kv_path_probe, room_claims, start_room_watch
from components.worker.lifecycle.shutdown import (
    DRAIN_MARGIN_S, StartupInterrupted, StopSignals, interrupt_startup, watch_engine_process,
)
from components.worker.lifecycle.signal_guard import SignalGuard
from components.worker.lifecycle.startup import connect_prefill, start_engine, warmup_prefill
from components.worker.lifecycle.tokenizer_workers import engine_pid, watch_exit
from components.worker.serving import Worker
from handlers.core.live import rid_prefix

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


async def run_worker(config: WorkerConfig, argv: list[str] | None = None) -> int:
    """Serve until stopped; the exit status (non-zero: the engine process was lost)."""
    interrupt_startup()
    bind_runtime_to_host(config.host)
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, config.dynamo.discovery_backend,
                                 config.dynamo.request_plane,
                                 event_plane=config.launch.event_plane,
                                 response_plane=config.launch.response_plane)
    if config.dynamo.migration_limit > 0:
        logger.warning("--migration-limit is a frontend setting in Dynamo 1.6.1; "
                       "pass it to dynamo.frontend")
    logger.info("starting %s engine (%s) for %s", config.backend.name, config.role.mode.value,
                config.served_model_name)
    started = time.monotonic()
    engine, workers = start_engine(config, sys.argv[1:] if argv is None else argv)
    load_seconds = time.monotonic() - started  # dynamo_component_model_load_time_seconds
    signals = StopSignals(asyncio.current_task(), workers)
    SignalGuard(loop).take(signals)
    if workers is not None:
        workers.watch(loop, lambda pid: config.backend.abort_process_requests(
            engine, rid_prefix(pid)))
    if engine_pid() is not None:
        watch_exit(loop, engine_pid(), signals.engine_exited)
    watch_engine_process(loop, engine, signals)
    handler = worker = lag = rooms = None
    try:
        if not config.node.first:  # its schedulers serve the first node's engine
            await follow(runtime, config, engine)
        prefill = await connect_prefill(runtime, config) if config.role.calls_prefill else None
        if config.role.claims_rooms:
            rooms = await room_claims(runtime, config)
        elif config.role.prefill:
            rooms = await start_room_watch(runtime, config, bootstrap_endpoint(config, engine),
                                           engine)
        metrics = WorkerMetrics(engine)
        lag = metrics.lag
        lag.start()
        handler = build_handler(config, engine, prefill, metrics, rooms,
                                kv_path_probe(config, engine, rooms))
        if config.dynamo.debug_routes:
            register_debug_routes(runtime, config.backend, engine)
        worker = Worker(config, runtime, engine, metrics, handler.live)
        worker.expose_metrics(load_seconds)
        if config.role.prefill:
            await warmup_prefill(config, engine)
        signals.worker = worker
        await worker.serve(handler)
    except asyncio.CancelledError:
        if not signals.interrupted:
            raise
        logger.info("stopped during startup: nothing was served")
        runtime.shutdown()
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
            await asyncio.to_thread(workers.stop, config.drain_timeout + DRAIN_MARGIN_S)
        engine.shutdown()
        logger.info("worker stopped")
    return 1 if signals.engine_lost else 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    config = parse_args(argv)
    configure_logging(config.log_level)
    dump_worker_config(config)  # 1.6.1's --dump-config-to
    code = 0
    try:
        # uvloop, as Dynamo's own workers run (`python -m dynamo.sglang`): its loop spends less
        # CPU per streamed item than asyncio's selector loop.
        code = uvloop.run(run_worker(config, argv))
    except StartupInterrupted as exc:
        logger.info("%s while the engine was starting: stopped, nothing was served", exc)
    # Everything is drained and shut down. Skip interpreter finalization: Dynamo's runtime
    # threads (health-check canaries) can still be entering Python, and finalization then
    # aborts the process ("FATAL: exception not rethrown", SIGABRT) instead of exiting 0.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # 1: the worker's engine process exited under it
