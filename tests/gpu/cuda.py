"""What the GPU tier runs on: whether it can run here (else every test skips with the reason),
the GPUs it may use, and the SGLang flags of its workers.

No import of sglang here and torch only when asked: the normal `.venv` (CPU torch) collects
tests/gpu too, and must skip it quickly.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Optional

# The SGLang flags of every GPU worker. float32 (the default): greedy output can be checked
# token for token against transformers; the project's random test model puts its top logits too
# close together for bfloat16's rounding to keep the argmax. SGLang's float32-capable attention on
# CUDA is torch_native (FlashInfer and FA3 take fp16/bf16 only; Triton's kernels multiply in
# TF32), which has no CUDA graphs. GPU_TEST_DTYPE=bfloat16 runs SGLang's own choices instead
# (attention backend, CUDA graphs: a deployment's path); the greedy checks then skip.
DTYPE = os.environ.get("GPU_TEST_DTYPE", "float32")
DTYPE_ARGS = {"float32": ("--dtype", "float32", "--attention-backend", "torch_native",
                          "--disable-cuda-graph"),
              "bfloat16": ("--dtype", "bfloat16")}
# Up to two engines share one GPU (disaggregated on a single GPU): a third of its memory each,
# and a small explicit pool, as the model and the tests need little.
ENGINE_ARGS = ("--context-length", "2048", "--max-total-tokens", "16384",
               "--max-running-requests", "32", "--mem-fraction-static", "0.35")
# An engine's first start on a GPU may compile kernels (JIT) before it serves.
READY_TIMEOUT_S = 600.0


@lru_cache(maxsize=1)
def skip_reason() -> Optional[str]:
    """Why the GPU tier cannot run here, or None."""
    if importlib.util.find_spec("sglang") is None:
        return ("sglang is not installed (`make install-gpu` builds .venv-gpu with Dynamo "
                "1.6.1's stack)")
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    if DTYPE not in DTYPE_ARGS:
        return f"GPU_TEST_DTYPE={DTYPE!r}: choose one of {sorted(DTYPE_ARGS)}"
    return None


def exact_greedy() -> bool:
    return DTYPE == "float32"


def visible_gpus() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the GPUs this process sees, in order."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()][:count]
    return [str(i) for i in range(count)]


def engine_args() -> tuple[str, ...]:
    return (*DTYPE_ARGS[DTYPE], *ENGINE_ARGS)
