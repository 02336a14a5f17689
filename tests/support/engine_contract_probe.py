"""Helper process for the engine contract test: runs the same scripted requests against one
engine (the embedded CPU engine or SGLang on CPU) through the Engine API, in each input mode
given (an engine built for each in turn, in this one process), and prints, as one JSON line per
mode, the shape of what came back: chunk keys, meta_info keys, per-chunk deltas, finish
reasons, and how errors and aborts surface.

    python -m tests.support.engine_contract_probe --engine cpu|sglang --model DIR \
        --modes tokens,text
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

PROMPT_IDS = [5, 6, 7, 8, 9, 10, 11]
GREEDY = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
PERSON_SCHEMA = json.dumps({
    "type": "object", "additionalProperties": False, "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 99}}})


def start_engine(kind: str, model: str, skip_tokenizer_init: bool) -> Any:
    args = dict(model_path=model, skip_tokenizer_init=skip_tokenizer_init, context_length=2048,
                max_total_tokens=8192, constrained_json_max_whitespace_cnt=1)
    if kind == "cpu":
        from components.engine.process.engine import CpuEngine

        return CpuEngine(**args)
    import sglang as sgl
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(device="cpu", attention_backend="torch_native",
                             disable_cuda_graph=True, dtype="float32", log_level="error", **args)
    server_args.incremental_streaming_output = True
    return sgl.Engine(server_args=server_args)


def shape(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    metas = [c.get("meta_info") or {} for c in chunks]
    return {
        "chunk_keys": sorted({k for c in chunks for k in c}),
        "meta_keys_first": sorted(metas[0]) if metas else [],
        "meta_keys_last": sorted(metas[-1]) if metas else [],
        "ids_per_chunk": [len(c.get("output_ids") or []) for c in chunks],
        "completion_tokens": [m.get("completion_tokens") for m in metas],
        "finish_reasons": [m.get("finish_reason") for m in metas],
        "texts": [c.get("text") for c in chunks],
        "ids": [i for c in chunks for i in (c.get("output_ids") or [])],
        "meta_ids": sorted({str(m.get("id")) for m in metas}),
        "indexes": sorted({c.get("index") for c in chunks if "index" in c}),
        # n > 1 interleaves the choices' chunks in an order that depends on timing: what is
        # fixed is each choice's last finish reason.
        "finish_by_index": {str(c.get("index")): m.get("finish_reason")
                            for c, m in zip(chunks, metas) if "index" in c},
    }


async def collect(engine: Any, abort_after: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """Stream one request; abort it by rid after `abort_after` chunks (0: before the first read).
    Records what came back and whatever was raised."""
    rid = uuid.uuid4().hex
    chunks: list[dict[str, Any]] = []
    try:
        stream = await engine.async_generate(stream=True, rid=rid, **kwargs)
        if abort_after == 0:
            engine.tokenizer_manager.abort_request(rid)
        async for chunk in stream:
            chunks.append(json.loads(json.dumps(chunk, default=str)))  # a copy: no aliasing
            if abort_after is not None and len(chunks) == abort_after:
                engine.tokenizer_manager.abort_request(rid)
    except Exception as exc:  # the point is to record how each engine surfaces errors
        return {**shape(chunks), "raised": type(exc).__name__, "message": str(exc)}
    return {**shape(chunks), "raised": None}


async def scenarios(engine: Any, skip_tokenizer_init: bool) -> dict[str, Any]:
    ids = {"input_ids": PROMPT_IDS}
    out: dict[str, Any] = {}
    out["stream"] = await collect(engine, sampling_params=GREEDY, **ids)
    whole = await engine.async_generate(sampling_params=GREEDY, **ids)
    out["whole"] = {**shape([whole]), "raised": None}
    if not skip_tokenizer_init:
        out["text_in"] = await collect(engine, sampling_params=GREEDY, prompt="hello there")
        # Structured output (SGLang builds no grammar backend with skip_tokenizer_init).
        json_greedy = {"temperature": 0.0, "max_new_tokens": 200, "json_schema": PERSON_SCHEMA}
        out["json_greedy"] = await collect(engine, sampling_params=json_greedy, **ids)
        out["bad_schema"] = await collect(engine, sampling_params={
            **GREEDY, "json_schema": '{"type": "nonsense"}'}, **ids)
    out["bad_top_k"] = await collect(engine, sampling_params={**GREEDY, "temperature": 0.7,
                                                              "top_k": 0}, **ids)
    out["too_long"] = await collect(engine, sampling_params=GREEDY, input_ids=[5] * 2100)
    long = {**GREEDY, "max_new_tokens": 400}
    out["abort_before_first"] = await collect(engine, abort_after=0, sampling_params=long, **ids)
    out["abort_after_first"] = await collect(engine, abort_after=1, sampling_params=long, **ids)
    engine.tokenizer_manager.abort_request(uuid.uuid4().hex)  # unknown rid: must not raise
    out["n2"] = await collect(engine, sampling_params={**GREEDY, "temperature": 0.7, "n": 2},
                              **ids)
    return out


MODES = {"tokens": True, "text": False}  # mode -> skip_tokenizer_init


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["cpu", "sglang"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--modes", default="tokens,text", help="comma-separated: tokens, text")
    ns = parser.parse_args()

    async def run(skip_tokenizer_init: bool) -> dict[str, Any]:
        # SGLang is driven from the loop it was built in (its TokenizerManager binds to it).
        engine = start_engine(ns.engine, ns.model, skip_tokenizer_init)
        try:
            return await asyncio.wait_for(scenarios(engine, skip_tokenizer_init), 120)
        finally:
            engine.shutdown()

    for mode in ns.modes.split(","):
        result = asyncio.run(run(MODES[mode]))
        sys.stdout.write(f"CONTRACT {mode} " + json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
