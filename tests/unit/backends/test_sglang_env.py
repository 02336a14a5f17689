"""The environment `--engine sglang` sets before `sgl.Engine` starts, as Dynamo 1.6.1's worker
does: no 60 s CUDA-coredump sleep on the event loop after a scheduler dies
(`dynamo/sglang/args.py`), and an engine on a node other than the first that returns instead of
blocking forever (`dynamo/sglang/init_llm.py`); and, this worker's own, a decode that forgets a
dead prefill within ~4 s (its heartbeat every 2 s), before a restarted one can be back."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from components.backends.sglang_env import (
    BLOCK_NONZERO_RANK_ENV, CUDA_COREDUMP_WAIT_ENV, HEARTBEAT_INTERVAL_ENV,
    prepare_sglang_environment,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """Unset during the test, restored after it (what the code under test sets included)."""
    for name in (CUDA_COREDUMP_WAIT_ENV, BLOCK_NONZERO_RANK_ENV, HEARTBEAT_INTERVAL_ENV,
                 "CUDA_ENABLE_USER_TRIGGERED_COREDUMP"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_the_engine_starts_with_the_environment_set(monkeypatch):
    import sglang

    from components.backends.sglang_engine import create_engine

    seen = {}

    class Engine:  # sgl.Engine, recording what its processes would inherit
        def __init__(self, server_args):
            seen.update({name: os.environ.get(name)
                         for name in (CUDA_COREDUMP_WAIT_ENV, BLOCK_NONZERO_RANK_ENV)})
            self.tokenizer_manager = None  # as SGLang leaves it on a node other than the first

    monkeypatch.setattr(sglang, "Engine", Engine)
    create_engine(SimpleNamespace(node_rank=1, crash_dump_folder=None))
    assert seen == {CUDA_COREDUMP_WAIT_ENV: "0", BLOCK_NONZERO_RANK_ENV: "0"}


def test_the_first_node_keeps_sglangs_blocking_default():
    prepare_sglang_environment(SimpleNamespace(node_rank=0))
    assert BLOCK_NONZERO_RANK_ENV not in os.environ


@pytest.mark.parametrize("env, args", [
    ({CUDA_COREDUMP_WAIT_ENV: "30"}, {}),  # the user's own value
    ({"CUDA_ENABLE_USER_TRIGGERED_COREDUMP": "1"}, {}),  # coredumps wanted
    ({}, {"crash_dump_folder": "/tmp/dumps"}),  # SGLang then enables them
])
def test_a_wanted_coredump_keeps_its_wait(monkeypatch, env, args):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prepare_sglang_environment(SimpleNamespace(node_rank=0, **args))
    assert os.environ.get(CUDA_COREDUMP_WAIT_ENV) == env.get(CUDA_COREDUMP_WAIT_ENV)


@pytest.mark.parametrize("mode, env, want", [
    ("decode", {}, "2"),
    ("decode", {HEARTBEAT_INTERVAL_ENV: "7"}, "7"),  # the user's own value
    ("prefill", {}, None),  # only a decode checks its prefills
    ("null", {}, None),
])
def test_a_decode_checks_its_prefills_every_2_s(monkeypatch, mode, env, want):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    prepare_sglang_environment(SimpleNamespace(node_rank=0, disaggregation_mode=mode))
    assert os.environ.get(HEARTBEAT_INTERVAL_ENV) == want
