"""Model registration with the Dynamo frontend (docs/architecture.md, "Two orchestration
styles").

- Frontend-orchestrated (Dynamo 1.6.1's style): both legs register under the served name.
  Decode as `WorkerType.Decode` with `needs=[[Prefill]]` (the frontend answers 503 until a
  prefill worker is registered too); prefill as `ModelType.Prefill` + `WorkerType.Prefill` with
  `needs=[[Decode]]` and its bootstrap endpoint in the runtime config, so the frontend's prefill
  router draws the room and sends both legs the same `bootstrap_info`.
- Decode-orchestrated: decode calls its prefill itself, so to the frontend it is a complete
  worker (`WorkerType.Aggregated`, no `needs`); the prefill serves a private endpoint and
  registers nothing.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Optional

from dynamo.llm import (
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
    unregister_model,
)

from components.worker.config import WorkerConfig, WorkerMode
from components.backends.limits import EngineLimits

logger = logging.getLogger(__name__)


class RegistrationError(RuntimeError):
    """The frontend-facing model registration failed; the worker must not keep running."""


# Both legs advertise that a prefill may be cancelled at any point, as Dynamo's SGLang worker
# does once it has checked that its engine orders aborts after dispatch (EngineLimits). The
# 1.6.1 frontend does not read it yet (it never cancels a prefill leg): the decode half stops
# the prefill itself through the room watch.
CANCEL_ANYTIME = "disagg_prefill_cancel_anytime_v1"


@dataclass(frozen=True)
class Role:
    worker_type: Any
    needs: list
    prefill_model: bool = False  # registers ModelType.Prefill, advertises its bootstrap endpoint


def role_for(config: WorkerConfig) -> Optional[Role]:
    """What this worker registers as; None: nothing (a decode-orchestrated prefill)."""
    frontend = config.dynamo.frontend_orchestrated
    if config.mode is WorkerMode.PREFILL:
        return Role(WorkerType.Prefill, [[WorkerType.Decode]], True) if frontend else None
    if config.mode is WorkerMode.DECODE and frontend:
        return Role(WorkerType.Decode, [[WorkerType.Prefill]])
    return Role(WorkerType.Aggregated, [])


def runtime_config_for(limits: EngineLimits, config: Optional[WorkerConfig] = None,
                       bootstrap: Optional[tuple[str, int]] = None) -> ModelRuntimeConfig:
    """`bootstrap`: the prefill engine's bootstrap server (host a decode can dial, port)."""
    runtime_config = ModelRuntimeConfig()
    runtime_config.context_length = limits.context_length
    runtime_config.total_kv_blocks = math.ceil(limits.max_total_num_tokens / limits.page_size)
    if limits.max_running_requests is not None:
        runtime_config.max_num_seqs = limits.max_running_requests
    if config is not None and config.mode is not WorkerMode.AGGREGATED \
            and config.dynamo.frontend_orchestrated:
        if limits.cancel_anytime:
            runtime_config.set_engine_specific(CANCEL_ANYTIME, json.dumps(True))
        if config.mode is WorkerMode.PREFILL:
            runtime_config.set_disaggregated_endpoint(*bootstrap)
    return runtime_config


def model_kind(skip_tokenizer_init: bool, prefill: bool = False) -> tuple[Any, Any]:
    """Tokens in/out when the frontend tokenizes; raw chat bodies otherwise
    (docs/architecture.md, "Two input modes"). A registered prefill is Tokens-only."""
    if prefill:
        return ModelInput.Tokens, ModelType.Prefill
    if skip_tokenizer_init:
        return ModelInput.Tokens, ModelType.Chat | ModelType.Completions
    return ModelInput.Text, ModelType.Chat


async def register_served_model(endpoint: Any, config: WorkerConfig, limits: EngineLimits,
                                bootstrap: Optional[tuple[str, int]] = None,
                                kv_events: bool = False) -> None:
    """`kv_events`: the worker publishes KV events (components/worker/kv_events.py), so the KV
    router may score it by cached blocks."""
    role = role_for(config)
    if role is None:
        return
    model_input, model_type = model_kind(config.skip_tokenizer_init, role.prefill_model)
    runtime_config = runtime_config_for(limits, config, bootstrap)
    runtime_config.kv_event_publishing_enabled = kv_events
    if not config.skip_tokenizer_init and not role.prefill_model:
        logger.info("Text mode (no --skip-tokenizer-init): only /v1/chat/completions is served")
    try:
        await register_model(
            model_input,
            model_type,
            endpoint,
            config.model_path,
            config.served_model_name,
            worker_type=role.worker_type,
            needs=role.needs,
            kv_cache_block_size=limits.page_size,
            runtime_config=runtime_config,
        )
    except Exception as exc:  # the runtime raises bare Exceptions; re-raise as one loud type
        raise RegistrationError(
            f"registering model {config.served_model_name!r} failed: {exc}") from exc
    logger.info("registered model %s (%s, %s) on %s", config.served_model_name,
                "tokens" if model_input is ModelInput.Tokens else "text", role.worker_type,
                config.dynamo.endpoint)


async def unregister_served_model(endpoint: Any) -> None:
    try:
        await unregister_model(endpoint)
    except Exception as exc:  # shutdown goes on; the endpoint unregisters next
        logger.warning("unregistering the model failed: %s", exc)
