"""Build the role's handler and its health-check payload from the worker config and engine."""

from __future__ import annotations

from typing import Any, Optional

from components.worker.flags.config import WorkerConfig
from components.worker.hosts import advertised_host
from components.worker.metrics.worker_metrics import WorkerMetrics
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
    engine's own record: the CPU engine reports the port it really bound (port 0). The host:
    the engine's own say first (SGLang: `--dist-init-addr`'s, where its first node runs, as
    Dynamo 1.6.1 advertises it), else the worker's address."""
    port = int(engine.server_args.disaggregation_bootstrap_port)
    host = config.backend.bootstrap_host(engine) or advertised_host(config.host, config.backend)
    return host, port


def build_handler(config: WorkerConfig, engine: Any, prefill_client: Optional[Any],
                  metrics: Optional[WorkerMetrics] = None, rooms: Optional[Any] = None,
                  kv_paths: Optional[Any] = None) -> Any:
    """`rooms`: the room watch (prefill) or the room claims (decode); `kv_paths`: the decode's
    KV path probe (`rooms/kv_probe.py`)."""
    if config.role.prefill:
        host, port = bootstrap_endpoint(config, engine)
        return PrefillHandler(engine, PrefillConfig(bootstrap_host=host, bootstrap_port=port,
                                                    orchestration=config.role.orchestration),
                              rooms=rooms)
    limits = config.backend.limits(engine)
    preprocessor = None
    if config.role.text_mode:
        tokenizer = engine.tokenizer_manager.tokenizer
        preprocessor = (metrics.timed_preprocessor(tokenizer) if metrics is not None
                        else Preprocessor(tokenizer))
    decode_config = DecodeConfig(
        served_model_name=config.served_model_name,
        context_length=limits.request_token_limit,
        vocab_size=_vocab_size(engine),
        skip_tokenizer_init=config.role.skip_tokenizer_init,
        orchestration=config.role.orchestration,
        bootstrap_timeout_s=config.dynamo.prefill_wait_timeout,
    )
    return DecodeHandler(engine, decode_config, prefill_client=prefill_client,
                         preprocessor=preprocessor, rooms=rooms,
                         parsers=_chat_parsers(config, preprocessor), kv_paths=kv_paths)


def _chat_parsers(config: WorkerConfig, preprocessor: Optional[Preprocessor]) -> Optional[Any]:
    """Text mode with SGLang's --tool-call-parser / --reasoning-parser: the worker parses its
    own output (Tokens mode: the frontend does, with the registered --dyn-* parsers)."""
    if preprocessor is None or not config.parsers.native:
        return None
    flags = config.parsers
    from components.backends.sglang_parsers import SglangChatParsers  # imports sglang

    return SglangChatParsers(flags.tool_call_parser, flags.reasoning_parser,
                             preprocessor.tokenizer,
                             whitespace={"any_whitespace": flags.json_any_whitespace,
                                         "max_whitespace_cnt": flags.json_max_whitespace_cnt})


def _bos_token_id(engine: Any) -> int:
    tokenizer = getattr(engine.tokenizer_manager, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    # Token 1 exists in every vocabulary we serve; it is only a canary prompt.
    return int(bos) if bos is not None else 1


def health_check_payload(config: WorkerConfig, engine: Any) -> dict[str, Any]:
    bos = _bos_token_id(engine)
    if config.role.prefill:
        return prefill_health_payload(bos)
    payload = decode_health_payload(bos, text_mode=config.role.text_mode)
    if config.role.receives_rooms:
        # No frontend injects a room into a canary: SGLang's fake host makes it a local no-op.
        port = int(engine.server_args.disaggregation_bootstrap_port)
        payload["bootstrap_info"] = {"bootstrap_host": FAKE_BOOTSTRAP_HOST,
                                     "bootstrap_port": port, "bootstrap_room": 1}
    return payload
