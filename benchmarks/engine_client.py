"""The baseline arm: the same workload straight into the engine, in-process (SGLang's Engine API).

The difference between this arm and the HTTP arms is what the component and the frontend add:
HTTP + SSE, the frontend's template/tokenize/detokenize, the request plane, the handler.
"""

from __future__ import annotations

import uuid

from benchmarks.loadgen import RequestResult, TokenClock
from benchmarks.workload import Prompt


class EngineArm:
    def __init__(self, engine, output_len: int) -> None:
        self.engine = engine
        self.output_len = output_len

    def sampling_params(self) -> dict:
        return {"max_new_tokens": self.output_len, "ignore_eos": True, "temperature": 0.0}

    async def send(self, prompt: Prompt) -> RequestResult:
        result = RequestResult(prompt_len=prompt.prompt_len)
        clock = TokenClock(result)
        stream = await self.engine.async_generate(
            input_ids=list(prompt.input_ids),
            sampling_params=self.sampling_params(),
            stream=True,
            rid=uuid.uuid4().hex,
        )
        meta: dict = {}
        async for chunk in stream:
            clock.tokens(len(chunk.get("output_ids") or ()))
            meta = chunk.get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        if finish.get("type") == "abort":
            result.error = f"engine abort: {finish.get('message')}"
        else:
            result.ok = True
            result.usage_completion_tokens = meta.get("completion_tokens")
            result.usage_prompt_tokens = meta.get("prompt_tokens")
        return clock.finish()


def start_engine(model_path: str, **overrides):
    """An aggregated CPU engine configured like the benchmark's workers (one torch thread)."""
    from components.engine.process.engine import CpuEngine

    kwargs = {"model_path": model_path, "skip_tokenizer_init": True, "num_threads": 1}
    kwargs.update(overrides)
    return CpuEngine(**kwargs)
