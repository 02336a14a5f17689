"""launch/disagg.sh in both orchestration styles and with N prefill + M decode workers (dry
runs): every worker line parses into the role, style and bootstrap port meant for it."""

from __future__ import annotations

import subprocess

import pytest

from components.backends import select as backend_select
from components.worker.flags.config import WorkerMode, parse_args
from tests.unit.worker.test_launch_flags import LAUNCH, dry_run, worker_args

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.delenv("DYN_DISAGG_ORCHESTRATOR", raising=False)


def workers(lines: dict[str, list[str]]) -> dict[str, object]:
    return {role: parse_args(worker_args(argv)) for role, argv in lines.items()
            if role != "frontend"}


@pytest.mark.parametrize("tokens, expected", [
    ("--skip-tokenizer-init", "frontend"), ("--no-skip-tokenizer-init", "decode")])
def test_the_default_style_follows_the_input_mode(tiny_model_path, tokens, expected):
    lines = dry_run("disagg.sh", "--cpu", "--model", tiny_model_path, tokens)
    assert {cfg.role.orchestrator.value for cfg in workers(lines).values()} == {expected}


@pytest.mark.parametrize("style", ["frontend", "decode"])
def test_n_prefill_and_m_decode_workers_with_their_own_bootstrap_ports(tiny_model_path, style):
    lines = dry_run("disagg.sh", "--cpu", "--model", tiny_model_path, "--bootstrap-port", "20000",
                    "--disagg-orchestrator", style, "--num-prefill", "3", "--num-decode", "2")
    cfgs = workers(lines)
    assert sorted(cfgs) == ["decode", "decode_1", "prefill", "prefill_1", "prefill_2"]
    prefills = [cfgs[n] for n in ("prefill", "prefill_1", "prefill_2")]
    assert all(c.role.mode is WorkerMode.PREFILL for c in prefills)
    assert [c.bootstrap_port for c in prefills] == [20000, 20001, 20002]
    assert all(cfgs[n].role.mode is WorkerMode.DECODE for n in ("decode", "decode_1"))
    assert {c.role.orchestrator.value for c in cfgs.values()} == {style}


def test_gpus_go_to_prefill_workers_first_then_decode_workers():
    lines = dry_run("disagg.sh", "--gpu", "--num-prefill", "2", "--num-decode", "2")
    gpus = {role: argv[1] for role, argv in lines.items() if role != "frontend"}
    assert gpus == {"prefill": "CUDA_VISIBLE_DEVICES=0", "prefill_1": "CUDA_VISIBLE_DEVICES=1",
                    "decode": "CUDA_VISIBLE_DEVICES=2", "decode_1": "CUDA_VISIBLE_DEVICES=3"}


@pytest.mark.parametrize("flags, words", [
    (["--no-skip-tokenizer-init", "--disagg-orchestrator", "frontend"], "needs Tokens mode"),
    (["--disagg-orchestrator", "router"], "must be frontend or decode"),
    (["--num-prefill", "0"], "must be >= 1"),
])
def test_bad_style_or_counts_exit_2_naming_the_problem(flags, words):
    bad = subprocess.run([str(LAUNCH / "disagg.sh"), "--dry-run", "--cpu", "--model", "/m",
                          *flags], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and words in bad.stderr, bad.stderr
