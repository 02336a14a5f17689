"""The GPU tier's topologies on `harness.topology`: the real frontend and SGLang workers on CUDA
as installed (no `SGLANG_USE_CPU_ENGINE`, none of the CPU stand-ins: `Stack(sglang_cpu=False)`),
the project's `small` model, Tokens mode (the frontend tokenizes, as Dynamo 1.6.1 serves SGLang).

Disaggregated: frontend-orchestrated (Dynamo 1.6.1's style), KV over NIXL from the prefill's
VRAM pool to the decode's; prefill and decode on two GPUs when there are two or more, else
sharing one (each engine takes `--mem-fraction-static` 0.35 of it: tests/gpu/cuda.py).
"""

from __future__ import annotations

from pathlib import Path

from harness.topology import Stack, free_port
from tests.gpu import cuda

MODEL = "small-gpu"


def _env(gpu: str) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": gpu}


def start_gpu_stack(workdir: Path, model_path: str, disaggregated: bool) -> Stack:
    """The stack, ready (one request served through it); on failure it is stopped and the error
    carries its logs. `stack.gpus` maps each worker to the GPU it was given."""
    stack = Stack(workdir, model_path, sglang_cpu=False)
    gpus = cuda.visible_gpus()
    try:
        stack.start_frontend()
        if disaggregated:
            stack.gpus = {"prefill": gpus[0], "decode": gpus[1 if len(gpus) > 1 else 0]}
            roles = ("--disaggregation-transfer-backend", "nixl", "--disagg-orchestrator",
                     "frontend")
            stack.start_worker("prefill", "prefill", MODEL, *cuda.engine_args(), *roles,
                               "--disaggregation-bootstrap-port", str(free_port()),
                               engine="sglang", env=_env(stack.gpus["prefill"]))
            stack.start_worker("decode", "decode", MODEL, *cuda.engine_args(), *roles,
                               engine="sglang", env=_env(stack.gpus["decode"]))
        else:
            stack.gpus = {"agg": gpus[0]}
            stack.start_worker("agg", "null", MODEL, *cuda.engine_args(), engine="sglang",
                               env=_env(stack.gpus["agg"]))
        stack.wait_ready(MODEL, timeout=cuda.READY_TIMEOUT_S, probe=True)
    except BaseException as exc:
        logs = stack.logs()
        stack.stop()
        if isinstance(exc, Exception):
            raise RuntimeError(f"the GPU stack did not come up: {exc}\n{logs}") from exc
        raise
    return stack


def worker_env(stack: Stack, name: str) -> dict[str, str]:
    """The environment a worker process runs with, as its /proc entry shows it."""
    raw = Path(f"/proc/{stack.procs[name].popen.pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)
