"""The serving arm: streaming OpenAI /v1/chat/completions against the Dynamo frontend (httpx).

Fixed output length as the serving benchmarks do it: `max_tokens` plus the top-level `ignore_eos`
extension; `stream_options.include_usage` so each stream ends with the server's own token count,
which is checked against the tokens received (a cumulative-delta bug would inflate one of them).
Tokens are counted from `nvext.completion_token_ids` (Dynamo's per-chunk token ids, asked for with
`nvext.extra_fields`), not from text deltas: the frontend's detokenizer holds back or merges
tokens that end inside a UTF-8 character, and emits empty deltas for tokens with no text.
"""

from __future__ import annotations

import json

import httpx

from benchmarks.loadgen import RequestResult, TokenClock
from benchmarks.workload import Prompt


class ChatClient:
    def __init__(self, base_url: str, model: str, output_len: int, concurrency: int) -> None:
        self.model = model
        self.output_len = output_len
        limits = httpx.Limits(
            max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
        )
        self._http = httpx.AsyncClient(
            base_url=base_url, limits=limits, timeout=httpx.Timeout(300.0, connect=10.0)
        )

    def body(self, prompt: Prompt) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt.text}],
            "max_tokens": self.output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "nvext": {"extra_fields": ["completion_token_ids"]},
        }

    async def send(self, prompt: Prompt) -> RequestResult:
        result = RequestResult(prompt_len=prompt.prompt_len)
        clock = TokenClock(result)
        async with self._http.stream(
            "POST", "/v1/chat/completions", json=self.body(prompt)
        ) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return clock.finish()
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                if not self._on_event(json.loads(data), clock, result):
                    return clock.finish()
        result.ok = result.usage_completion_tokens is not None
        if not result.ok:
            result.error = "stream ended without a usage chunk"
        return clock.finish()

    @staticmethod
    def _on_event(event: dict, clock: TokenClock, result: RequestResult) -> bool:
        if "error" in event:
            result.error = f"stream error: {str(event['error'])[:200]}"
            return False
        token_ids = (event.get("nvext") or {}).get("completion_token_ids")
        if token_ids is not None:
            clock.tokens(len(token_ids))
        else:  # a frontend without nvext: one token per content delta (may undercount)
            clock.tokens(
                sum(1 for c in event.get("choices") or () if (c.get("delta") or {}).get("content"))
            )
        usage = event.get("usage")
        if usage:
            result.usage_completion_tokens = usage.get("completion_tokens")
            result.usage_prompt_tokens = usage.get("prompt_tokens")
        return True

    async def models(self) -> list[str]:
        resp = await self._http.get("/v1/models")
        resp.raise_for_status()
        return [m["id"] for m in resp.json().get("data", [])]

    async def close(self) -> None:
        await self._http.aclose()
