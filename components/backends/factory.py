"""The one place that decides which engine a worker runs, and builds it.

`sglang` needs an importable `sglang` package and CUDA, or SGLang's own CPU path chosen with
SGLang's switch `SGLANG_USE_CPU_ENGINE=1`; everything else runs the embedded CPU engine
(`components.engine`), which speaks the same Engine API. Nothing here imports sglang:
that happens only in `components.backends.sglang`, and only when the sglang engine is chosen.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from components.backends.limits import EngineLimits, sglang_on_cpu

logger = logging.getLogger(__name__)

ENGINE_CHOICES = ("auto", "cpu", "sglang")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def sglang_importable() -> bool:
    # find_spec, not import: importing sglang costs seconds and pulls in triton.
    return importlib.util.find_spec("sglang") is not None


def resolve_engine_kind(requested: str) -> str:
    """Map `--engine auto|cpu|sglang` to the engine that will actually run."""
    if requested not in ENGINE_CHOICES:
        raise ValueError(f"--engine must be one of {ENGINE_CHOICES}, got {requested!r}")
    if requested == "cpu":
        return "cpu"
    has_sglang, has_cuda = sglang_importable(), cuda_available()
    if requested == "sglang":
        if not (has_sglang and (has_cuda or sglang_on_cpu())):
            raise SystemExit(
                "--engine sglang needs the sglang package and a CUDA device, or "
                "SGLANG_USE_CPU_ENGINE=1 for SGLang's CPU path "
                f"(cuda available: {has_cuda}, sglang importable: {has_sglang}); "
                "use --engine cpu to run the embedded CPU engine"
            )
        return "sglang"
    kind = "sglang" if (has_sglang and has_cuda) else "cpu"
    logger.info("--engine auto -> %s (cuda=%s, sglang=%s)", kind, has_cuda, has_sglang)
    return kind


def build_engine(kind: str, engine_args: Any) -> Any:
    """Start the engine (loads the model; takes seconds). `engine_args` comes from
    `components.worker.config`: CPU `EngineConfig` kwargs or an SGLang `ServerArgs`."""
    if kind == "sglang":
        from components.backends.sglang import create_engine

        return create_engine(engine_args)
    from components.engine.api.engine import CpuEngine

    return CpuEngine(**dict(engine_args))


def attach_engine(kind: str, parent_pid: int) -> Any:
    """The Engine API in a tokenizer worker process, run by the engine of `parent_pid`."""
    if kind == "sglang":
        from components.backends.sglang import attach_engine as attach_sglang

        return attach_sglang(parent_pid)
    from components.engine.api.engine import CpuEngine

    return CpuEngine.attach_tokenizer_worker(parent_pid)


def abort_process_requests(kind: str, engine: Any, prefix: str) -> None:
    """An attached process (`--tokenizer-worker-num`) is gone: abort what it asked for. The CPU
    engine does so itself when the process's connection drops."""
    if kind == "sglang":
        from components.backends.sglang import abort_process_requests as abort_sglang

        abort_sglang(engine, prefix)


def end_orphaned_requests(kind: str, engine: Any, message: str) -> int:
    """An attached process whose engine process is gone: end the requests it holds. The CPU
    engine's attachment ends them itself when its connection drops."""
    if kind == "sglang":
        from components.backends.sglang import end_orphaned_requests as end_sglang

        return end_sglang(engine, message)
    return 0


def engine_limits(kind: str, engine: Any) -> EngineLimits:
    if kind == "sglang":
        from components.backends.sglang import sglang_limits

        return sglang_limits(engine)
    return EngineLimits(
        context_length=int(engine.context_length),
        max_total_num_tokens=int(engine.max_total_num_tokens),
        max_running_requests=engine.max_running_requests,
        page_size=int(engine.page_size),
    )
