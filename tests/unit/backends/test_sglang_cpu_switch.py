"""`SGLANG_USE_CPU_ENGINE` read as SGLang reads it (exactly "1": its CPU path): a value SGLang
would ignore is refused at startup, naming the variable, rather than having the worker set up a
CPU engine that SGLang starts on CUDA."""

from __future__ import annotations

import pytest

from components.backends import select as backend_select
from components.worker.flags.config import parse_args

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)


@pytest.mark.parametrize("value", ["true", "yes", "2", " 1"])
def test_a_value_sglang_does_not_read_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", value)
    with pytest.raises(SystemExit, match="SGLANG_USE_CPU_ENGINE"):
        parse_args(["--engine", "sglang", "--model-path", "/models/tiny"])


@pytest.mark.parametrize("value, on_cpu", [("1", True), ("0", False), ("", False)])
def test_sglangs_own_values_are_read_as_sglang_reads_them(monkeypatch, value, on_cpu):
    from components.backends.limits import sglang_on_cpu

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", value)
    assert sglang_on_cpu() is on_cpu
