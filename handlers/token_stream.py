"""Tokens mode: engine chunks -> token deltas {"token_ids", "finish_reason"?, "completion_usage"?}.

The engine streams incrementally (disjoint `output_ids`), so each chunk is passed through as
is: O(1) work per chunk, nothing cumulative kept. The final chunk's tokens are delivered with
its finish reason (the old Dynamo handler dropped them: max_tokens=1 returned nothing). Logprobs,
when asked for, ride with their tokens (handlers/logprobs.py).
"""

from typing import Any, Optional

from handlers.errors import EngineError
from handlers.finish import map_finish_reason, usage_from_meta
from handlers.logprobs import tokens_fields
from protocol.outputs import TokenDelta, to_wire


class TokenStream:
    """One per request; `convert` returns the dict to yield, or None for nothing new."""

    def __init__(self) -> None:
        self.completion_tokens = 0
        self.prompt_tokens = 0

    def convert(self, chunk: dict[str, Any]) -> Optional[dict[str, Any]]:
        ids = chunk.get("output_ids")
        if ids is None:
            raise EngineError("engine chunk carries no output_ids")
        meta = chunk.get("meta_info") or {}
        reason = map_finish_reason(meta.get("finish_reason"))
        index = int(chunk.get("index") or 0)
        if reason is None:
            if not ids:
                return None
            return to_wire(TokenDelta(token_ids=ids, index=index, **tokens_fields(meta)))
        usage = usage_from_meta(meta)
        self.prompt_tokens = usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        return to_wire(
            TokenDelta(token_ids=ids, index=index, finish_reason=reason, completion_usage=usage,
                       **tokens_fields(meta))
        )

    def close(self) -> Optional[dict[str, Any]]:
        """Nothing trails a token stream (usage rides on each choice's last delta)."""
        return None
