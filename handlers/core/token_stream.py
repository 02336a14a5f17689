"""Tokens mode: engine chunks -> token deltas {"token_ids", "finish_reason"?, "completion_usage"?,
"stop_reason"?, "engine_data"?}.

The engine streams incrementally (disjoint `output_ids`), so each chunk is passed through as
is: O(1) work per chunk, nothing cumulative kept. The final chunk's tokens are delivered with
its finish reason (the old Dynamo handler dropped them: max_tokens=1 returned nothing). Logprobs,
when asked for, ride with their tokens (handlers/core/logprobs.py). The last delta also carries
SGLang's matched stop as Dynamo's `stop_reason` and, when asked for, the prompt logprobs in
`engine_data.prompt_logprobs`, as Dynamo's SGLang worker yields them; the 1.6.1 frontend shows
both only under `nvext` when the client names them in `nvext.extra_fields` (it has no
`matched_stop` field on a choice, and does not echo the prompt).
"""

from typing import Any, Optional

from handlers.core.errors import EngineError
from handlers.core.finish import map_finish_reason, matched_stop, usage_from_meta
from handlers.core.logprobs import prompt_logprobs_payload, tokens_fields
from protocol.preprocessed import OutputOptions
from protocol.outputs import TokenDelta, to_wire


class TokenStream:
    """One per request; `convert` returns the dict to yield, or None for nothing new."""

    def __init__(self, options: Optional[OutputOptions] = None) -> None:
        self.completion_tokens = 0
        self.prompt_tokens = 0
        options = options or OutputOptions()
        self._logprobs = options.logprobs  # None: the client asked for no token logprobs
        self._prompt_top = options.prompt_logprobs  # None: no prompt logprobs

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
            return to_wire(TokenDelta(token_ids=ids, index=index, **self._logprob_fields(meta)))
        usage = usage_from_meta(meta)
        self.prompt_tokens = usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        return to_wire(
            TokenDelta(token_ids=ids, index=index, finish_reason=reason, completion_usage=usage,
                       stop_reason=matched_stop(meta.get("finish_reason")),
                       engine_data=self._engine_data(meta), **self._logprob_fields(meta))
        )

    def _logprob_fields(self, meta: dict[str, Any]) -> dict[str, Any]:
        # Prompt logprobs alone also make the engine return token logprobs: not asked, not sent.
        return {} if self._logprobs is None else tokens_fields(meta, self._logprobs)

    def _engine_data(self, meta: dict[str, Any]) -> Optional[dict[str, Any]]:
        if self._prompt_top is None:
            return None
        payload = prompt_logprobs_payload(meta, self._prompt_top)
        return None if payload is None else {"prompt_logprobs": payload}

    def close(self) -> Optional[dict[str, Any]]:
        """Nothing trails a token stream (usage rides on each choice's last delta)."""
        return None
