"""Model registration with the Dynamo frontend (agg and decode workers only).

The decode worker orchestrates its prefill itself (docs/architecture.md, "A request's life"),
so to the frontend it is a
complete worker: it registers as `WorkerType.Aggregated` with no `needs`. Registering it as
`WorkerType.Decode` with `needs=[[Prefill]]` would make the 1.6.1 frontend answer 503 until a
*registered* prefill model appears and then run its own PrefillRouter - neither
fits, since our prefill workers serve a private endpoint and register no model.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from dynamo.llm import (
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
    unregister_model,
)

from components.args import WorkerConfig
from components.engine_limits import EngineLimits

logger = logging.getLogger(__name__)


class RegistrationError(RuntimeError):
    """The frontend-facing model registration failed; the worker must not keep running."""


def runtime_config_for(limits: EngineLimits) -> ModelRuntimeConfig:
    config = ModelRuntimeConfig()
    config.context_length = limits.context_length
    config.total_kv_blocks = math.ceil(limits.max_total_num_tokens / limits.page_size)
    if limits.max_running_requests is not None:
        config.max_num_seqs = limits.max_running_requests
    return config


def model_kind(skip_tokenizer_init: bool) -> tuple[Any, Any]:
    """Tokens in/out when the frontend tokenizes; raw chat bodies otherwise
    (docs/architecture.md, "Two input modes")."""
    if skip_tokenizer_init:
        return ModelInput.Tokens, ModelType.Chat | ModelType.Completions
    return ModelInput.Text, ModelType.Chat


async def register_served_model(endpoint: Any, config: WorkerConfig, limits: EngineLimits,
                                kv_events: bool = False) -> None:
    """`kv_events`: the worker publishes KV events (components/kv_publishing.py), so the KV
    router may score it by cached blocks."""
    model_input, model_type = model_kind(config.skip_tokenizer_init)
    runtime_config = runtime_config_for(limits)
    runtime_config.kv_event_publishing_enabled = kv_events
    if not config.skip_tokenizer_init:
        logger.info("Text mode (no --skip-tokenizer-init): only /v1/chat/completions is served")
    try:
        await register_model(
            model_input,
            model_type,
            endpoint,
            config.model_path,
            config.served_model_name,
            worker_type=WorkerType.Aggregated,
            needs=[],
            kv_cache_block_size=limits.page_size,
            runtime_config=runtime_config,
        )
    except Exception as exc:  # the runtime raises bare Exceptions; re-raise as one loud type
        raise RegistrationError(
            f"registering model {config.served_model_name!r} failed: {exc}") from exc
    logger.info("registered model %s (%s) on %s", config.served_model_name,
                "tokens" if config.skip_tokenizer_init else "text", config.dynamo.endpoint)


async def unregister_served_model(endpoint: Any) -> None:
    try:
        await unregister_model(endpoint)
    except Exception as exc:  # shutdown goes on; the endpoint unregisters next
        logger.warning("unregistering the model failed: %s", exc)
