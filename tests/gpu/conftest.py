"""The GPU tier (`make test-gpu`): SGLang on CUDA behind the real frontend. The header says what
it runs on; every test skips, with the reason, where it cannot run (tests/gpu/cuda.py)."""

from __future__ import annotations

import importlib.metadata

from tests.gpu import cuda


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def pytest_report_header(config) -> list[str]:
    reason = cuda.skip_reason()
    if reason is not None:
        return [f"GPU tier: skipped ({reason})"]
    import torch

    gpus = cuda.visible_gpus()
    names = [torch.cuda.get_device_name(i) for i in range(len(gpus))]
    versions = ", ".join(f"{d} {_version(d)}" for d in ("ai-dynamo", "sglang", "nixl", "torch"))
    return [f"GPU tier: {len(gpus)} GPU(s) {names} (CUDA_VISIBLE_DEVICES ids {gpus}); {versions}",
            f"GPU tier: SGLang flags {' '.join(cuda.engine_args())}"]
