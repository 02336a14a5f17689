"""Engine finish reasons -> the only values the frontend accepts (stop, length,
content_filter, cancelled), or an error when the engine aborted with a status."""

import logging
from typing import Any, Optional, Union

from handlers.core.errors import EngineError, EngineUnavailable, RequestError
from protocol.outputs import CompletionUsage, PromptTokensDetails

logger = logging.getLogger(__name__)

_PASS_THROUGH = frozenset({"stop", "length", "content_filter"})


def map_finish_reason(reason: Any) -> Optional[str]:
    """None while the request runs; SGLang's {"type": ..., ...} dict (or a bare string) at the
    end. An abort without a status is a cancellation; with status 400 it is the client's error
    (RequestError, shown as a 400), with 503 the engine is busy (EngineUnavailable, a 503); any
    other status is an engine failure."""
    if reason is None:
        return None
    info = reason if isinstance(reason, dict) else {"type": reason}
    kind = info.get("type")
    if kind in _PASS_THROUGH:
        return kind
    if kind == "abort":
        status = info.get("status_code")
        if status is None:
            return "cancelled"
        message = str(info.get("message") or "request aborted by the engine")
        if int(status) == 400:
            raise RequestError(message)
        if int(status) == 503:
            raise EngineUnavailable(f"engine unavailable: {message}")
        raise EngineError(f"engine aborted the request (status {int(status)}): {message}")
    # The frontend answers an unknown reason with a 500 although the tokens were fine.
    logger.warning("unknown engine finish reason %r reported as stop", kind)
    return "stop"


def matched_stop(reason: Any) -> Optional[Union[str, int]]:
    """SGLang's ``matched_stop``: the stop string (or regex) or the token id (a stop id, EOS, a
    grammar's end) that ended the choice; None for length, an abort or a bare reason."""
    if not isinstance(reason, dict) or reason.get("type") != "stop":
        return None
    matched = reason.get("matched")
    return matched if isinstance(matched, (str, int)) and not isinstance(matched, bool) else None


def usage_from_meta(meta: dict[str, Any]) -> CompletionUsage:
    prompt = int(meta.get("prompt_tokens") or 0)
    completion = int(meta.get("completion_tokens") or 0)
    cached = meta.get("cached_tokens")
    return CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=None if cached is None else PromptTokensDetails(int(cached)),
    )
