"""Build the role's handler and its health-check payload from the worker config and engine."""

from __future__ import annotations

from typing import Any, Optional

from components.worker.config import WorkerConfig, WorkerMode
from components.backends.factory import engine_limits
from components.worker.hosts import advertised_host
from components.worker.metrics import WorkerMetrics
from handlers import (
    DecodeConfig,
    FAKE_BOOTSTRAP_HOST,
    DecodeHandler,
    PrefillConfig,
    PrefillHandler,
    Preprocessor,
    decode_health_payload,
    prefill_health_payload,
)

def _vocab_size(engine: Any) -> int:
    size = getattr(engine, "vocab_size", None)
    if size is None:  # sglang: the model config knows it
        size = engine.tokenizer_manager.model_config.vocab_size
    return int(size)


def bootstrap_endpoint(config: WorkerConfig, engine: Any) -> tuple[str, int]:
    """Where a decode engine dials this prefill engine's bootstrap server. The port is the
    engine's own record: the CPU engine reports the port it really bound (port 0)."""
    port = int(engine.server_args.disaggregation_bootstrap_port)
    return advertised_host(config.host, config.engine_kind), port


def build_handler(config: WorkerConfig, engine: Any, prefill_client: Optional[Any],
                  metrics: Optional[WorkerMetrics] = None, rooms: Optional[Any] = None) -> Any:
    """`rooms`: the room watch (prefill) or the room claims (decode), frontend-orchestrated."""
    if config.mode is WorkerMode.PREFILL:
        host, port = bootstrap_endpoint(config, engine)
        return PrefillHandler(engine, PrefillConfig(bootstrap_host=host, bootstrap_port=port),
                              rooms=rooms)
    limits = engine_limits(config.engine_kind, engine)
    preprocessor = None
    if not config.skip_tokenizer_init:
        tokenizer = engine.tokenizer_manager.tokenizer
        preprocessor = (metrics.timed_preprocessor(tokenizer) if metrics is not None
                        else Preprocessor(tokenizer))
    decode_config = DecodeConfig(
        served_model_name=config.served_model_name,
        context_length=limits.request_token_limit,
        vocab_size=_vocab_size(engine),
        skip_tokenizer_init=config.skip_tokenizer_init,
        disaggregated=config.mode is WorkerMode.DECODE,
        orchestrator=config.dynamo.orchestrator,
        bootstrap_timeout_s=config.dynamo.prefill_wait_timeout,
    )
    return DecodeHandler(engine, decode_config, prefill_client=prefill_client,
                         preprocessor=preprocessor, rooms=rooms)


def _bos_token_id(engine: Any) -> int:
    tokenizer = getattr(engine.tokenizer_manager, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    # Token 1 exists in every vocabulary we serve; it is only a canary prompt.
    return int(bos) if bos is not None else 1


def health_check_payload(config: WorkerConfig, engine: Any) -> dict[str, Any]:
    bos = _bos_token_id(engine)
    if config.mode is WorkerMode.PREFILL:
        return prefill_health_payload(bos)
    payload = decode_health_payload(bos, text_mode=not config.skip_tokenizer_init)
    if config.mode is WorkerMode.DECODE and config.dynamo.frontend_orchestrated:
        # No frontend injects a room into a canary: SGLang's fake host makes it a local no-op.
        port = int(engine.server_args.disaggregation_bootstrap_port)
        payload["bootstrap_info"] = {"bootstrap_host": FAKE_BOOTSTRAP_HOST,
                                     "bootstrap_port": port, "bootstrap_room": 1}
    return payload
