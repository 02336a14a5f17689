"""What a worker sets up before it serves: its engine (or an attachment to the engine process of
`--tokenizer-worker-num`), a decode-orchestrated decode's prefill client, a prefill's warm-up."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from components.worker.config import WorkerConfig
from components.worker.runtime import RuntimePrefillClient
from components.worker.tokenizer_workers import TokenizerWorkers, engine_pid, exit_with_engine

logger = logging.getLogger(__name__)


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
    await config.backend.warmup_prefill(engine)


def start_engine(config: WorkerConfig, argv: list[str]) -> tuple[Any, TokenizerWorkers | None]:
    """The engine, or an attachment to the engine process's; with --tokenizer-worker-num N > 1
    the engine process also starts the N - 1 attached ones (`components.worker.tokenizer_workers`)."""
    parent = engine_pid()
    if parent is not None:
        exit_with_engine()
        return config.backend.attach(parent), None
    engine = config.backend.build(config.engine_args)
    count = config.backend.tokenizer_worker_count(config.engine_args)
    return engine, (TokenizerWorkers.start(count, argv) if count > 1 else None)
