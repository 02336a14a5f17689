"""Load generation and metrics, with the definitions sglang.bench_serving and vllm bench serve use.

- TTFT: request sent -> first chunk carrying a token.
- ITL: every gap between consecutive token-carrying chunks (a distribution, not a mean per request).
- TPOT: (e2e - TTFT) / (output tokens - 1), per request.
- Throughput: completed requests and output tokens over the wall time of the run.
A client ("arm") is any `async send(prompt) -> RequestResult`; the loops here are arm-agnostic, so
the HTTP frontend and the in-process engine run exactly the same schedule.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

from benchmarks.common import percentile
from benchmarks.workload import Prompt


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    tokens_received: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None


class TokenClock:
    """Timestamps one streamed request: call `tokens(n)` for each chunk carrying n tokens."""

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.start = time.perf_counter()
        self.last = 0.0

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.result.tokens_received == 0:
            self.result.ttft = now - self.start
        else:
            self.result.itls.append(now - self.last)
        self.last = now
        self.result.tokens_received += n

    def finish(self) -> RequestResult:
        self.result.e2e = time.perf_counter() - self.start
        return self.result


Send = Callable[[Prompt], Awaitable[RequestResult]]


async def run_closed_loop(
    send: Send, prompts: Sequence[Prompt], concurrency: int, timeout_s: float
) -> tuple[list[RequestResult], float]:
    """`concurrency` clients, each sending its next prompt as soon as the previous one ends."""
    queue = list(prompts)
    results: list[RequestResult] = []

    async def client() -> None:
        while queue:
            results.append(await _guarded(send, queue.pop(0), timeout_s))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(concurrency, len(prompts)))))
    return results, time.perf_counter() - start


async def run_open_loop(
    send: Send,
    prompts: Sequence[Prompt],
    rate: float,
    seed: int,
    max_concurrency: int | None,
    timeout_s: float,
) -> tuple[list[RequestResult], float]:
    """Poisson arrivals at `rate` req/s (sglang's --request-rate), optionally capped in flight."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(prompt: Prompt) -> RequestResult:
        if gate is None:
            return await _guarded(send, prompt, timeout_s)
        async with gate:
            return await _guarded(send, prompt, timeout_s)

    start = time.perf_counter()
    tasks = []
    for prompt in prompts:
        tasks.append(asyncio.create_task(one(prompt)))
        await asyncio.sleep(rng.expovariate(rate))  # the schedule itself, not a synchronization
    results = list(await asyncio.gather(*tasks))
    return results, time.perf_counter() - start


async def _guarded(send: Send, prompt: Prompt, timeout_s: float) -> RequestResult:
    try:
        return await asyncio.wait_for(send(prompt), timeout_s)
    except asyncio.TimeoutError:
        return RequestResult(
            error=f"timed out after {timeout_s:.0f} s", prompt_len=prompt.prompt_len
        )
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point, not a crash
        return RequestResult(error=f"{type(exc).__name__}: {exc}", prompt_len=prompt.prompt_len)


def summarize(results: Sequence[RequestResult], wall_s: float, expected_output: int) -> dict:
    """One run's metrics (times in ms); integrity counters say if the numbers can be trusted."""
    done = [r for r in results if r.ok]
    ttfts = [r.ttft * 1e3 for r in done]
    itls = [gap * 1e3 for r in done for gap in r.itls]
    tpots = [
        (r.e2e - r.ttft) * 1e3 / (r.tokens_received - 1) for r in done if r.tokens_received > 1
    ]
    out_tokens = sum(r.tokens_received for r in done)
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "usage_mismatch": sum(1 for r in done if r.usage_completion_tokens != r.tokens_received),
        "short_output": sum(1 for r in done if r.tokens_received != expected_output),
        "prompt_len_mismatch": sum(
            1 for r in done if r.usage_prompt_tokens not in (None, r.prompt_len)
        ),
        "wall_s": wall_s,
        "req_per_s": len(done) / wall_s if wall_s else float("nan"),
        "output_tok_per_s": out_tokens / wall_s if wall_s else float("nan"),
        "input_tok_per_s": sum(r.prompt_len for r in done) / wall_s if wall_s else float("nan"),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "ttft_mean_ms": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        "itl_p50_ms": percentile(itls, 50),
        "itl_p99_ms": percentile(itls, 99),
        "tpot_mean_ms": sum(tpots) / len(tpots) if tpots else float("nan"),
        "e2e_p50_ms": percentile([r.e2e * 1e3 for r in done], 50),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
    }
