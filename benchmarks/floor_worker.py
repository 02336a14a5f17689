"""The floor under any Dynamo worker written in Python: an endpoint that only streams.

It registers like an aggregated Tokens-mode worker and answers each request with `max_tokens`
token deltas, one per `--step-ms` of one shared clock (an engine's decode step emits one token
per running request), from a plain async generator: no engine, no handler, no metrics. What its process
spends per token is what Dynamo 1.6.1's Python bindings cost per streamed item (the request
plane, the Rust <-> Python bridge, the event loop), the part of the worker's CPU per token that
no change in this project can remove (benchmarks/bench_token_cpu.py, arm `floor`).

    python -m benchmarks.floor_worker --model-path M --served-model-name S [--step-ms 3.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os

import uvloop
from dynamo.llm import ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime


class StepClock:
    """One timer for every stream: each step wakes all the generators waiting for it."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._waiting: list[asyncio.Future] = []

    def next_step(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        return fut

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._step_s)
            waiting, self._waiting = self._waiting, []
            for fut in waiting:
                if not fut.done():
                    fut.set_result(None)


async def serve(args: argparse.Namespace) -> None:
    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    namespace = os.environ.get("DYN_NAMESPACE", "dynamo")
    endpoint = runtime.endpoint(f"{namespace}.floor.generate")
    config = ModelRuntimeConfig()
    config.context_length = 4096
    await register_model(ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint,
                         args.model_path, args.served_model_name, worker_type=WorkerType.Aggregated,
                         needs=[], runtime_config=config)
    clock = StepClock(args.step_ms / 1e3)
    ticking = asyncio.create_task(clock.run())

    async def handler(request: dict, context=None):  # the endpoint's generator itself
        prompt = request.get("token_ids") or [0]
        max_tokens = int((request.get("stop_conditions") or {}).get("max_tokens") or 16)
        for i in range(max_tokens):
            if i:  # the first token at once: its TTFT is the frontend and request plane alone
                await clock.next_step()
            yield {"token_ids": [prompt[i % len(prompt)]],
                   "finish_reason": "length" if i == max_tokens - 1 else None}

    try:
        await endpoint.serve_endpoint(handler)
    finally:
        ticking.cancel()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--step-ms", type=float, default=3.5)
    uvloop.run(serve(p.parse_args()))  # the loop Dynamo's own workers and this project's run


if __name__ == "__main__":
    main()
