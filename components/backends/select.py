"""The one place that decides which engine a worker runs.

`sglang` needs an importable `sglang` package and CUDA, or SGLang's own CPU path chosen with
SGLang's switch `SGLANG_USE_CPU_ENGINE=1`; everything else runs the embedded CPU engine
(`components.engine`), which speaks the same Engine API. Nothing here imports sglang or torch's
engine code: the chosen backend does, when it builds its engine.
"""

from __future__ import annotations

import importlib.util
import logging

from components.backends.base import EngineBackend
from components.backends.cpu import CpuBackend
from components.backends.limits import sglang_on_cpu
from components.backends.sglang import SglangBackend

logger = logging.getLogger(__name__)

BACKENDS: dict[str, type] = {"cpu": CpuBackend, "sglang": SglangBackend}
ENGINE_CHOICES = ("auto", *BACKENDS)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def sglang_importable() -> bool:
    # find_spec, not import: importing sglang costs seconds and pulls in triton.
    return importlib.util.find_spec("sglang") is not None


def _resolve(requested: str) -> str:
    if requested not in ENGINE_CHOICES:
        raise ValueError(f"--engine must be one of {ENGINE_CHOICES}, got {requested!r}")
    if requested == "cpu":
        return requested
    has_sglang, has_cuda = sglang_importable(), cuda_available()
    if requested == "sglang":
        if not (has_sglang and (has_cuda or sglang_on_cpu())):
            raise SystemExit(
                "--engine sglang needs the sglang package and a CUDA device, or "
                "SGLANG_USE_CPU_ENGINE=1 for SGLang's CPU path "
                f"(cuda available: {has_cuda}, sglang importable: {has_sglang}); "
                "use --engine cpu to run the embedded CPU engine"
            )
        return requested
    chosen = "sglang" if (has_sglang and has_cuda) else "cpu"
    logger.info("--engine auto -> %s (cuda=%s, sglang=%s)", chosen, has_cuda, has_sglang)
    return chosen


def select_backend(requested: str) -> EngineBackend:
    """Map `--engine auto|cpu|sglang` to the backend of the engine that will actually run."""
    return BACKENDS[_resolve(requested)]()
