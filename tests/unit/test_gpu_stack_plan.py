"""The GPU tier's topologies (tests/gpu/stacks.py) as planned, without a GPU: nothing starts
(the stack's process spawning is recorded instead). Its SGLang workers get neither SGLang's CPU
switch nor the CPU stand-ins, even when this process's environment has them; prefill and decode
take two GPUs when there are two, else share one; every worker's flags are ones the worker's
own parser (with SGLang's) takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.backends.sglang import SglangBackend
from components.worker.flags.config import build_parser
from harness import topology
from harness.topology import SGLANG_CPU_PATH, Stack
from tests.gpu import cuda, stacks

pytestmark = pytest.mark.timeout(120)


class Spawned:
    """Stands in for `Stack._spawn`: records each process's argv and environment."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[list[str], dict[str, str]]] = {}

    def spawn(self, stack: Stack, name: str, argv: list[str], env: dict[str, str],
              system_port: int | None = None) -> topology.Proc:
        self.calls[name] = (argv, env)
        proc = topology.Proc(name, popen=None, log_path=stack.workdir / f"{name}.log")
        stack.procs[name] = proc
        return proc


@pytest.fixture
def spawned(monkeypatch) -> Spawned:
    spawned = Spawned()
    monkeypatch.setattr(Stack, "_spawn", lambda stack, *args, **kw: spawned.spawn(stack, *args,
                                                                                  **kw))
    monkeypatch.setattr(Stack, "wait_ready", lambda self, *names, **kw: None)
    # What a CPU test run leaves in the environment must not reach a GPU worker.
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv("PYTHONPATH", str(SGLANG_CPU_PATH))
    return spawned


def _plan(monkeypatch, spawned: Spawned, tmp_path: Path, gpus: list[str],
          disaggregated: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    monkeypatch.setattr(cuda, "visible_gpus", lambda: gpus)
    stacks.start_gpu_stack(tmp_path, "/models/small", disaggregated)
    return spawned.calls


@pytest.mark.parametrize("gpus, expected", [(["0", "1"], {"prefill": "0", "decode": "1"}),
                                            (["5", "7", "9"], {"prefill": "5", "decode": "7"}),
                                            (["3"], {"prefill": "3", "decode": "3"})])
def test_disaggregated_takes_two_gpus_when_there_are_two_else_shares_one(
        monkeypatch, spawned, tmp_path, gpus, expected):
    calls = _plan(monkeypatch, spawned, tmp_path, gpus, disaggregated=True)
    assert sorted(calls) == ["decode", "frontend", "prefill"]
    assert {n: env["CUDA_VISIBLE_DEVICES"] for n, (_, env) in calls.items()
            if n != "frontend"} == expected


@pytest.mark.parametrize("disaggregated", [False, True])
def test_sglang_workers_run_as_installed_without_the_cpu_switch_or_stand_ins(
        monkeypatch, spawned, tmp_path, disaggregated):
    calls = _plan(monkeypatch, spawned, tmp_path, ["0", "1"], disaggregated)
    workers = {n: c for n, c in calls.items() if n != "frontend"}
    assert workers
    for name, (argv, env) in workers.items():
        assert argv[argv.index("--engine") + 1] == "sglang", name
        assert "SGLANG_USE_CPU_ENGINE" not in env, name
        assert str(SGLANG_CPU_PATH) not in env.get("PYTHONPATH", ""), name
    # The CPU tiers' stacks keep both (the default).
    assert topology.engine_env("sglang")["SGLANG_USE_CPU_ENGINE"] == "1"


@pytest.mark.parametrize("dtype", sorted(cuda.DTYPE_ARGS))
def test_the_workers_flags_parse_with_the_workers_own_parser(monkeypatch, spawned, tmp_path,
                                                             dtype):
    monkeypatch.setattr(cuda, "DTYPE", dtype)
    calls = _plan(monkeypatch, spawned, tmp_path, ["0"], disaggregated=True)
    parser = build_parser(SglangBackend())
    modes = {}
    for name in ("prefill", "decode"):
        argv = calls[name][0]
        ns = parser.parse_args(argv[argv.index("--engine"):])
        modes[name] = ns.disaggregation_mode
        assert (ns.dtype, ns.mem_fraction_static) == (dtype, 0.35)
        assert ns.disaggregation_transfer_backend == "nixl"
        assert ns.skip_tokenizer_init  # Tokens mode: frontend-orchestrated needs it
    assert modes == {"prefill": "prefill", "decode": "decode"}
    assert os.environ["SGLANG_USE_CPU_ENGINE"] == "1"  # the parse changed nothing around it
