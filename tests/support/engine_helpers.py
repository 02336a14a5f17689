"""Shared helpers for the CPU engine tests: reference generation, draining, bounded polling."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Callable

import torch

DEADLINE_S = 20.0


def reference_greedy(model, ids: list[int], max_new_tokens: int, eos_ids) -> list[int]:
    """``model.generate(do_sample=False)`` on stock sdpa: the tokens the engine must reproduce."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids),
            pad_token_id=0,
        )
    return out[0, len(ids):].tolist()


def load_reference(model_path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    return model.eval()


def boot(prefill_proc, **override: Any) -> dict[str, Any]:
    """A fresh room on a prefill engine process's bootstrap server (fields overridable)."""
    b = {"bootstrap_host": "127.0.0.1",
         "bootstrap_port": prefill_proc.server_args["disaggregation_bootstrap_port"],
         "bootstrap_room": random.randrange(1, 2**63)}
    return {**b, **override}


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]  # skip the special tokens 0..2


async def drain(stream) -> list[dict[str, Any]]:
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
    return chunks


async def wait_until(predicate: Callable[[], bool], timeout: float = DEADLINE_S,
                     what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.01)


def assert_chunk_shape(chunk: dict[str, Any], with_text: bool) -> None:
    assert set(chunk) == ({"text", "output_ids", "meta_info"} if with_text
                          else {"output_ids", "meta_info"})
    meta = chunk["meta_info"]
    required = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}
    assert required <= set(meta)
    assert ("e2e_latency" in meta) == (meta["finish_reason"] is not None)


def _bytes_to_unicode():
    """GPT-2 byte-level alphabet: byte -> the character its base token is spelled with."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_token_ids(tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte, so every multi-byte character is split across tokens."""
    table = _bytes_to_unicode()
    ids = tokenizer.convert_tokens_to_ids([table[b] for b in text.encode("utf-8")])
    assert tokenizer.unk_token_id not in ids and None not in ids
    return ids
