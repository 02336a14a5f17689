"""The tests' worker zygote (harness/zygote.py): a forked worker exits as `python -m components`
would (its code, or -signal; its output in its log), in a session of its own with the
environment it was given; which environments share a zygote; what is not forked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness.topology import HOST, REPO, free_port
from harness.zygote import _WORKER, RUNTIME_ONLY, ZygoteProcess, _key, _Zygotes

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def zygotes(monkeypatch):
    monkeypatch.setenv("TEST_WORKER_ZYGOTE", "1")
    pool = _Zygotes()
    yield pool
    pool.close()


def spawn(zygotes, log, *args: str, **env: str) -> ZygoteProcess:
    # One OpenMP thread, as the harness gives every worker: a zygote must be single-threaded.
    proc = zygotes.spawn([*_WORKER, "--engine", "cpu", *args],
                         {**os.environ, "OMP_NUM_THREADS": "1", **env}, REPO, log)
    assert isinstance(proc, ZygoteProcess)
    return proc


def test_a_forked_worker_exits_with_its_code_and_writes_its_log(zygotes, tmp_path):
    proc = spawn(zygotes, tmp_path / "help.log", "--help")
    assert proc.wait(60) == 0
    assert "--disaggregation-mode" in (tmp_path / "help.log").read_text()
    proc = spawn(zygotes, tmp_path / "bad.log", "--no-such-flag")
    assert proc.wait(60) == 2  # argparse's exit, as from a fresh interpreter
    assert "python -m components: error: " in (tmp_path / "bad.log").read_text()


def test_a_serving_worker_has_its_session_and_environment_and_ends_by_signal(zygotes, tmp_path,
                                                                            tiny_model_path):
    env = {"DYN_FILE_KV": str(tmp_path / "kv"), "DYN_DISCOVERY_BACKEND": "file",
           "DYN_REQUEST_PLANE": "tcp", "DYN_SYSTEM_PORT": str(free_port()),
           "DYN_SYSTEM_HOST": HOST, "ZYGOTE_TEST_MARK": "here"}
    log = tmp_path / "worker.log"
    proc = spawn(zygotes, log, "--model-path", tiny_model_path, "--host", HOST,
                 "--skip-tokenizer-init", "--context-length", "256", "--max-total-tokens", "1024",
                 "--endpoint", "dyn://zygote.test.generate", **env)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.5)  # serving
    assert os.getsid(proc.pid) == proc.pid  # its process group is its pid
    assert b"ZYGOTE_TEST_MARK=here" in open(f"/proc/{proc.pid}/environ", "rb").read()
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL


def test_runtime_variables_share_a_zygote_and_others_do_not():
    env = {"PATH": "/bin", "DYN_SYSTEM_PORT": "1", "PYTEST_CURRENT_TEST": "x"}
    same = {**env, "DYN_SYSTEM_PORT": "2", "ETCD_ENDPOINTS": "e", "NATS_SERVER": "n",
            "PYTEST_CURRENT_TEST": "y"}
    assert _key("cpu", env) == _key("cpu", same)
    assert _key("cpu", env) != _key("sglang", env)
    assert _key("cpu", env) != _key("cpu", {**env, "SGLANG_DETOKENIZER_MAX_STATES": "8"})
    assert all(prefix.isupper() for prefix in RUNTIME_ONLY)


def test_a_zygote_that_would_fork_threads_is_not_used(zygotes, tmp_path, capsys):
    """Without OMP_NUM_THREADS=1, importing torch starts OpenMP's threads: no zygote."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    assert zygotes.spawn([*_WORKER, "--engine", "cpu", "--help"], env, REPO, tmp_path / "l") is None
    assert "threads after preloading; not forking" in capsys.readouterr().err


def test_without_the_switch_or_for_another_command_nothing_is_forked(zygotes, tmp_path):
    other = [sys.executable, "-m", "dynamo.frontend"]
    assert zygotes.spawn(other, dict(os.environ), REPO, tmp_path / "log") is None
    plain = {**os.environ, "TEST_WORKER_ZYGOTE": "0"}  # the worker's environment decides
    assert zygotes.spawn([*_WORKER, "--help"], plain, REPO, tmp_path / "log") is None
    assert not zygotes.by_key  # no zygote was started for either
