"""Health-check (canary) payloads the runtime sends to each role's endpoint when
DYN_HEALTH_CHECK_ENABLED is set; shapes follow Dynamo's own SGLang component,
adapted to this project's wire."""

from typing import Any

# The prefill handler streams nothing to a decode for a marked request and hands the engine
# SGLang's fake bootstrap host, whose "transfer" is a no-op (no decode will join the room).
HEALTH_CHECK_KEY = "_health_check"


def decode_health_payload(bos_token_id: int, text_mode: bool) -> dict[str, Any]:
    """For agg and decode workers: one token from a one-token prompt (or a tiny chat)."""
    if text_mode:
        return {
            "messages": [{"role": "user", "content": "Test"}],
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": True,
        }
    return {
        "token_ids": [bos_token_id],
        "stop_conditions": {"max_tokens": 1, "ignore_eos": False},
        "sampling_options": {"temperature": 0.0, "top_p": 1.0, "top_k": -1},
        "eos_token_ids": [],
        "annotations": [],
    }


def prefill_health_payload(bos_token_id: int) -> dict[str, Any]:
    return {
        "request": {"token_ids": [bos_token_id]},
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1},
        HEALTH_CHECK_KEY: True,
    }


def is_health_check(request: Any) -> bool:
    """Our own canary (the runtime sends it, marked), in decode's request shape in both
    orchestration styles."""
    return isinstance(request, dict) and bool(request.get(HEALTH_CHECK_KEY))
