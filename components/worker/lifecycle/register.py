"""Model registration with the Dynamo frontend (docs/reference/orchestration.md).

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

from dynamo.common.configuration.groups.router_args import build_router_config
from dynamo.common.utils.endpoint_types import parse_endpoint_types
from dynamo.llm import (
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    WorkerType,
    register_model,
    unregister_model,
)

from components.backends.limits import EngineLimits
from components.backends.node import WORKER_GROUP_ID_KEY
from components.worker.flags.config import WorkerConfig
from components.worker.role import WorkerRole

logger = logging.getLogger(__name__)


class RegistrationError(RuntimeError):
    """The frontend-facing model registration failed; the worker must not keep running."""


# Both legs advertise that a prefill may be cancelled at any point, as Dynamo's SGLang worker
# does once it has checked that its engine orders aborts after dispatch (EngineLimits). The
# 1.6.1 frontend does not read it yet (it never cancels a prefill leg): the decode half stops
# the prefill itself through the room watch.
CANCEL_ANYTIME = "disagg_prefill_cancel_anytime_v1"


@dataclass(frozen=True)
class Registration:
    worker_type: Any
    needs: list
    prefill_model: bool = False  # registers ModelType.Prefill, advertises its bootstrap endpoint


def registration_for(role: WorkerRole) -> Optional[Registration]:
    """What this worker registers as; None: nothing (a decode-orchestrated prefill)."""
    if not role.registers:
        return None
    if role.prefill:
        return Registration(WorkerType.Prefill, [[WorkerType.Decode]], True)
    if role.receives_rooms:
        return Registration(WorkerType.Decode, [[WorkerType.Prefill]])
    return Registration(WorkerType.Aggregated, [])


def runtime_config_for(limits: EngineLimits, config: Optional[WorkerConfig] = None,
                       bootstrap: Optional[tuple[str, int]] = None) -> ModelRuntimeConfig:
    """`bootstrap`: the prefill engine's bootstrap server (host a decode can dial, port)."""
    runtime_config = ModelRuntimeConfig()
    runtime_config.context_length = limits.context_length
    runtime_config.total_kv_blocks = math.ceil(limits.max_total_num_tokens / limits.page_size)
    runtime_config.data_parallel_start_rank = 0
    runtime_config.data_parallel_size = limits.dp_size
    if limits.enable_eagle:
        runtime_config.enable_eagle = True
    if limits.max_running_requests is not None:
        runtime_config.max_num_seqs = limits.max_running_requests
    if limits.max_num_batched_tokens is not None:
        runtime_config.max_num_batched_tokens = limits.max_num_batched_tokens
    if config is not None:
        # As Dynamo 1.6.1's worker does: the frontend parses tool calls and reasoning with
        # these (None: no parsing) in what it detokenizes.
        runtime_config.tool_call_parser = config.parsers.dyn_tool_call_parser
        runtime_config.reasoning_parser = config.parsers.dyn_reasoning_parser
        # As 1.6.1: a decode worker serves no worker-local KV indexer (its KV publisher, if
        # any, gets the same value: kv_events.py); every other role advertises one.
        runtime_config.enable_local_indexer = local_indexer(config.role)
        runtime_config.exclude_tools_when_tool_choice_none = (
            config.launch.exclude_tools_when_tool_choice_none)
        if config.node.group_id is not None:
            # The engine's other nodes find this instance by it and relay their own DP ranks'
            # KV events under its id (components/worker/lifecycle/follower.py), as 1.6.1's do.
            runtime_config.set_engine_specific(WORKER_GROUP_ID_KEY,
                                               json.dumps(config.node.group_id))
    if config is not None and config.role.frontend_orchestrated:
        if limits.cancel_anytime:
            runtime_config.set_engine_specific(CANCEL_ANYTIME, json.dumps(True))
        if config.role.prefill:
            runtime_config.set_disaggregated_endpoint(*bootstrap)
    return runtime_config


def local_indexer(role: WorkerRole) -> bool:
    return not role.decode


def served_endpoints(config: WorkerConfig, model_type: Any) -> Any:
    """1.6.1's `--endpoint-types` (chat, completions or none) for a Tokens-mode model; a
    Text-mode model serves chat (or nothing, with none)."""
    wanted = parse_endpoint_types(config.launch.endpoint_types)
    if wanted == ModelType.Empty or not config.role.text_mode:
        return wanted
    return model_type


def model_kind(skip_tokenizer_init: bool, prefill: bool = False) -> tuple[Any, Any]:
    """Tokens in/out when the frontend tokenizes; raw chat bodies otherwise
    (docs/reference/input-modes.md). A registered prefill is Tokens-only."""
    if prefill:
        return ModelInput.Tokens, ModelType.Prefill
    if skip_tokenizer_init:
        return ModelInput.Tokens, ModelType.Chat | ModelType.Completions
    return ModelInput.Text, ModelType.Chat


async def register_served_model(endpoint: Any, config: WorkerConfig, limits: EngineLimits,
                                bootstrap: Optional[tuple[str, int]] = None,
                                kv_events: bool = False) -> None:
    """`kv_events`: the worker publishes KV events (components/worker/metrics/kv_events.py), so the
    KV router may score it by cached blocks."""
    role = registration_for(config.role)
    if role is None:
        return
    model_input, model_type = model_kind(config.role.skip_tokenizer_init, role.prefill_model)
    if not role.prefill_model:
        model_type = served_endpoints(config, model_type)
    runtime_config = runtime_config_for(limits, config, bootstrap)
    runtime_config.kv_event_publishing_enabled = kv_events
    if config.role.text_mode and not role.prefill_model:
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
            kv_cache_block_size=limits.kv_block_size,
            runtime_config=runtime_config,
            custom_template_path=config.launch.custom_jinja_template,
            router_config=build_router_config(config.launch.router),
            model_aliases=list(config.launch.model_aliases) or None,
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
