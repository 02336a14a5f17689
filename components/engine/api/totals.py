"""Per-engine request totals: what SGLang's tokenizer counts into `sglang:prompt_tokens_total`,
`sglang:generation_tokens_total`, `sglang:cached_tokens_total` and
`sglang:num_requests_total`, counted here when a request's final chunk leaves the engine thread
and read by the worker's metrics at scrape time (components/worker/metrics/sglang_metrics.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Totals:
    requests: int = 0           # finished requests (choices), aborted ones included, as SGLang
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0      # prompt tokens served from the prefix cache

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens, 0.0-1.0."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class RequestTotals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = Totals()

    def record(self, meta: dict[str, Any]) -> None:
        """One finished request, from its final chunk's `meta_info` (engine thread)."""
        with self._lock:
            t = self._totals
            self._totals = replace(
                t, requests=t.requests + 1,
                prompt_tokens=t.prompt_tokens + int(meta.get("prompt_tokens") or 0),
                generation_tokens=t.generation_tokens + int(meta.get("completion_tokens") or 0),
                cached_tokens=t.cached_tokens + int(meta.get("cached_tokens") or 0))

    def snapshot(self) -> Totals:
        with self._lock:
            return self._totals
