"""What a worker sets up before it serves: its engine (or an attachment to the engine process of
`--tokenizer-worker-num`), a decode-orchestrated decode's prefill client, a prefill's warm-up."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from components.worker.flags.config import WorkerConfig
from components.worker.lifecycle.runtime import RuntimePrefillClient
from components.worker.lifecycle.tokenizer_workers import (TokenizerWorkers, engine_pid,
                                                            exit_with_engine)

logger = logging.getLogger(__name__)


# How often a decode still waiting for a prefill instance says so.
PREFILL_WAIT_LOG_INTERVAL_S = 30.0


async def connect_prefill(runtime: Any, config: WorkerConfig) -> RuntimePrefillClient:
    """Decode only: a client for the prefill endpoint, once an instance is listed. A prefill
    lists itself only after its own load and warm-up (on GPUs also CUDA-graph capture), which
    can take longer than this decode's load: `--prefill-instance-timeout` bounds the wait, and
    the decode says every 30 s that it is still waiting."""
    client = await runtime.endpoint(config.dynamo.prefill_endpoint).client()
    prefill = RuntimePrefillClient(client)
    timeout, endpoint = config.dynamo.prefill_instance_timeout, config.dynamo.prefill_endpoint
    logger.info("waiting up to %.0fs for a prefill instance on %s", timeout, endpoint)
    started = time.monotonic()
    waiting = asyncio.ensure_future(prefill.wait_for_instance(timeout))
    try:
        while not (await asyncio.wait({waiting}, timeout=PREFILL_WAIT_LOG_INTERVAL_S))[0]:
            logger.info("still waiting for a prefill instance on %s (%.0fs of %.0fs; "
                        "--prefill-instance-timeout)", endpoint, time.monotonic() - started,
                        timeout)
        ids = waiting.result()
    except asyncio.TimeoutError:
        raise SystemExit(f"no prefill worker appeared on {endpoint} within {timeout:.0f}s "
                         "(--prefill-instance-timeout)") from None
    finally:
        waiting.cancel()  # a stop signal during startup cancels this wait
    logger.info("prefill instances: %s", [f"{i:x}" for i in ids])
    return prefill


async def warmup_prefill(config: WorkerConfig, engine: Any) -> None:
    """SGLang prefill engines take one request through the prefill path before serving, as
    Dynamo's do; the CPU engine has nothing to compile or allocate lazily."""
    await config.backend.warmup_prefill(engine)


def start_engine(config: WorkerConfig, argv: list[str]) -> tuple[Any, TokenizerWorkers | None]:
    """The engine, or an attachment to the engine process's; with --tokenizer-worker-num N > 1
    the engine process also starts the N - 1 attached ones
    (`components.worker.lifecycle.tokenizer_workers`)."""
    parent = engine_pid()
    if parent is not None:
        exit_with_engine()
        return config.backend.attach(parent), None
    engine = config.backend.build(config.engine_args)
    if not config.node.first:  # no tokenizer on this node: the first node's engine has it
        return engine, None
    count = config.backend.tokenizer_worker_count(config.engine_args)
    return engine, (TokenizerWorkers.start(count, argv) if count > 1 else None)
