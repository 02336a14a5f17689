"""An engine with SGLang's Engine API that streams N one-token chunks as fast as it can."""

from __future__ import annotations

from types import SimpleNamespace


class SyntheticEngine:
    """Yields N chunks of one token each (incremental, as SGLang's incremental_streaming_output)."""

    def __init__(self, with_text: bool) -> None:
        self.with_text = with_text
        self.tokenizer_manager = SimpleNamespace(tokenizer=None, abort_request=lambda rid: None)

    async def async_generate(
        self, input_ids=None, sampling_params=None, stream=False, rid=None, **_bootstrap
    ):
        n = int(sampling_params["max_new_tokens"])
        return self._chunks(n, rid, len(input_ids))

    async def _chunks(self, n: int, rid, prompt_len: int):
        for i in range(1, n + 1):
            meta = {
                "id": rid,
                "finish_reason": {"type": "length", "length": n} if i == n else None,
                "prompt_tokens": prompt_len,
                "completion_tokens": i,
                "cached_tokens": 0,
            }
            chunk = {"output_ids": [100 + i % 1000], "meta_info": meta}
            if self.with_text:
                chunk["text"] = "a"
            yield chunk
