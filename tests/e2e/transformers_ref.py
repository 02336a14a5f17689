"""Greedy token ids from transformers itself: the reference both engines must match."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=2)
def _model(path: str, device: str = "cpu") -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype="float32").to(device).eval()


def greedy_ids(model_path: str, prompt: list[int], n: int, device: str = "cpu") -> list[int]:
    """`n` argmax steps with no end-of-sequence stop (what ignore_eos asks of the engines), in
    float32 on `device` (the GPU tier: "cuda", beside the engine it checks)."""
    import torch

    model = _model(model_path, device)
    ids = torch.tensor([prompt], device=device)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def greedy_logprobs(model_path: str, prompt: list[int], n: int, top: int
                    ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
    """`n` argmax steps with, per step, `log_softmax` of transformers' logits: the chosen
    token's logprob and the `top` best (logprob, id) pairs (SGLang's greedy logprobs)."""
    import torch

    model = _model(model_path, "cpu")  # the same cache key as greedy_ids' on CPU
    ids = torch.tensor([prompt])
    out: list[int] = []
    lps: list[float] = []
    tops: list[list[tuple[float, int]]] = []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(ids).logits[0, -1].float(), dim=-1)
            nxt = int(logp.argmax())
            vals, idx = torch.topk(logp, top)
            out.append(nxt)
            lps.append(float(logp[nxt]))
            tops.append(list(zip(vals.tolist(), idx.tolist())))
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out, lps, tops


def prompt_logprobs(model_path: str, prompt: list[int]) -> list[float]:
    """`log_softmax` of transformers' logits at each prompt position for the prompt's next
    token: entry i is token i + 1's logprob (SGLang's prompt logprobs from position 0)."""
    import torch

    model = _model(model_path, "cpu")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    return [float(logp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
