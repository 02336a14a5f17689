"""launch/*.sh on GPUs (dry runs against a stub `nvidia-smi`): each worker gets as many GPUs as
its own --tp/--dp/--pp-size need, indices count within an existing CUDA_VISIBLE_DEVICES, too few
GPUs are refused naming both counts, per-role args reach only their role, and the python chosen
is the one with CUDA (checked before anything starts)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from components.backends import select as backend_select
from components.backends.sglang import SglangBackend
from components.worker.flags.config import build_parser
from tests.unit.worker.test_launch_flags import LAUNCH, with_model, worker_args

pytestmark = pytest.mark.timeout(120)

REPO = LAUNCH.parent


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)


def fake_gpus(tmp_path: Path, count: int) -> dict[str, str]:
    """An environment whose `nvidia-smi -L` lists `count` GPUs, without CUDA_VISIBLE_DEVICES."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    gpus = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dd)\n"
                   for i in range(count))
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s' '{gpus}'\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHON")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def launch(env: dict[str, str], *flags: str, script: str = "disagg.sh",
           launch_dir: Path = LAUNCH) -> subprocess.CompletedProcess:
    return subprocess.run([str(launch_dir / script), *flags], env=env, capture_output=True,
                          text=True, timeout=60)


def dry_lines(env: dict[str, str], *flags: str, script: str = "disagg.sh",
              launch_dir: Path = LAUNCH) -> dict[str, list[str]]:
    done = launch(env, "--dry-run", *flags, script=script, launch_dir=launch_dir)
    assert done.returncode == 0, done.stderr
    return {role: shlex.split(cmd) for role, _, cmd in
            (line.partition(":") for line in done.stdout.splitlines())}


def devices(lines: dict[str, list[str]]) -> dict[str, str]:
    """{worker: its CUDA_VISIBLE_DEVICES}."""
    out = {}
    for role, argv in lines.items():
        if role != "frontend":
            assert argv[0] == "env" and argv[1].startswith("CUDA_VISIBLE_DEVICES="), argv
            out[role] = argv[1].partition("=")[2]
    return out


def server_args(argv: list[str], model: str):
    """The worker line through the worker's parser and the real SGLang ServerArgs."""
    from components.backends.sglang_engine import server_args_from_namespace

    ns = build_parser(SglangBackend()).parse_args(with_model(worker_args(argv), model))
    return server_args_from_namespace(ns)


@pytest.mark.parametrize("count, flags, expected, sizes", [
    (2, [], {"prefill": "0", "decode": "1"}, (1, 1, False)),
    (8, ["--", "--tp", "4"], {"prefill": "0,1,2,3", "decode": "4,5,6,7"}, (4, 1, False)),
    (8, ["--prefill-args", "--tp-size 4", "--decode-args", "--tensor-parallel-size=4"],
     {"prefill": "0,1,2,3", "decode": "4,5,6,7"}, (4, 1, False)),
    (4, ["--num-prefill", "2", "--num-decode", "2"],
     {"prefill": "0", "prefill_1": "1", "decode": "2", "decode_1": "3"}, (1, 1, False)),
    # Without DP attention each DP rank is a whole replica: dp*tp GPUs per worker.
    (4, ["--", "--dp", "2"], {"prefill": "0,1", "decode": "2,3"}, (1, 2, False)),
    # With it the DP ranks share the TP GPUs: tp GPUs per worker.
    (4, ["--", "--tp", "2", "--dp-size", "2", "--enable-dp-attention"],
     {"prefill": "0,1", "decode": "2,3"}, (2, 2, True)),
    (8, ["--", "--tp", "2", "--dp", "2"], {"prefill": "0,1,2,3", "decode": "4,5,6,7"},
     (2, 2, False)),
    (8, ["--prefill-gpus", "4,5,6,7", "--decode-gpus", "0,1,2,3", "--", "--tp", "4"],
     {"prefill": "4,5,6,7", "decode": "0,1,2,3"}, (4, 1, False)),
])
def test_each_worker_gets_the_gpus_its_own_args_need(tmp_path, tiny_model_path, count, flags,
                                                     expected, sizes):
    lines = dry_lines(fake_gpus(tmp_path, count), "--gpu", *flags)
    assert devices(lines) == expected
    tp, dp, dp_attention = sizes
    for role, argv in lines.items():
        if role == "frontend":
            continue
        args = server_args(argv, tiny_model_path)
        assert (args.tp_size, args.dp_size, args.enable_dp_attention) == (tp, dp, dp_attention)
        assert args.disaggregation_mode == role.partition("_")[0]
        assert args.disaggregation_transfer_backend == "nixl"


def test_an_existing_cuda_visible_devices_is_mapped_through_not_overridden(tmp_path):
    env = fake_gpus(tmp_path, 8)  # CUDA_VISIBLE_DEVICES, when set, is what this launch may use
    env["CUDA_VISIBLE_DEVICES"] = "4,5,6,7"
    assert devices(dry_lines(env, "--gpu", "--", "--tp", "2")) == {"prefill": "4,5",
                                                                   "decode": "6,7"}
    assert devices(dry_lines(env, "--gpu", "--prefill-gpus", "3", "--decode-gpus", "0")) == {
        "prefill": "7", "decode": "4"}
    worker = dry_lines(env, "--gpu", "--gpus", "1,2", "--", "--tp", "2", script="agg.sh")["worker"]
    assert worker[:2] == ["env", "CUDA_VISIBLE_DEVICES=5,6"]


@pytest.mark.parametrize("count, visible, flags, words", [
    (2, None, ["--", "--tp", "2"], "needs 4 (1 prefill x 2 + 1 decode x 2 GPUs), 2 available "
                                   "(nvidia-smi -L)"),
    (8, "4,5,6,7", ["--", "--tp", "4"], "needs 8 (1 prefill x 4 + 1 decode x 4 GPUs), "
                                        "4 available (CUDA_VISIBLE_DEVICES=4,5,6,7)"),
    (4, None, ["--", "--dp", "2", "--tp", "2"], "needs 8 (1 prefill x 4 + 1 decode x 4 GPUs), "
                                                "4 available"),
    (4, None, ["--decode-gpus", "4"], "needs 5 (1 prefill x 1 + 1 decode x 1 GPUs), 4 available"),
    (0, None, [], "needs 2 (1 prefill x 1 + 1 decode x 1 GPUs), 0 available"),
])
def test_too_few_gpus_are_refused_naming_needed_and_available(tmp_path, count, visible, flags,
                                                              words):
    env = fake_gpus(tmp_path, count)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    done = launch(env, "--dry-run", "--gpu", *flags)
    assert done.returncode == 1 and words in done.stderr, done.stderr
    assert done.stdout == ""


def test_agg_refuses_too_few_gpus_too(tmp_path):
    done = launch(fake_gpus(tmp_path, 1), "--dry-run", "--gpu", "--", "--tp", "2", script="agg.sh")
    assert done.returncode == 1
    assert "needs 2 (1 worker x 2 GPUs), 1 available (nvidia-smi -L)" in done.stderr


@pytest.mark.parametrize("flags, words", [
    (["--decode-gpus", "2,3", "--", "--tp", "1"],
     "--decode-gpus 2,3: 1 decode worker(s) x 1 GPUs need 1"),
    (["--prefill-gpus", "0;1"], "--prefill-gpus takes GPU indices like 0,1"),
    (["--", "--tp", "0"], "sizes must be >= 1, got 0"),
    (["--prefill-args", "--tp '2"], "--prefill-args: cannot split"),
])
def test_bad_gpu_lists_and_sizes_exit_2_naming_the_problem(tmp_path, flags, words):
    done = launch(fake_gpus(tmp_path, 8), "--dry-run", "--gpu", *flags)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_per_role_args_reach_only_their_role(tmp_path, tiny_model_path):
    events = '{"publisher":"zmq","endpoint":"tcp://*:5557"}'
    lines = dry_lines(fake_gpus(tmp_path, 2), "--gpu", "--num-prefill", "1",
                      "--prefill-args", "--mem-fraction-static 0.61",
                      "--decode-args", f"--kv-events-config '{events}'",
                      "--", "--max-running-requests", "8")
    prefill = server_args(lines["prefill"], tiny_model_path)
    decode = server_args(lines["decode"], tiny_model_path)
    assert prefill.mem_fraction_static == 0.61 and decode.mem_fraction_static != 0.61
    assert decode.kv_events_config == events and prefill.kv_events_config is None
    assert prefill.max_running_requests == decode.max_running_requests == 8


def test_per_role_args_work_on_the_cpu_engine_too(tiny_model_path):
    lines = dry_lines(dict(os.environ), "--cpu", "--model", tiny_model_path,
                      "--decode-args", "--max-total-tokens 4096")
    assert "--max-total-tokens" in lines["decode"] and "--max-total-tokens" not in lines["prefill"]


def repo_copy(tmp_path: Path, venvs: tuple[str, ...]) -> Path:
    """launch/ in a repository of its own, with stub pythons in the named virtualenvs."""
    root = tmp_path / "repo"
    shutil.copytree(LAUNCH, root / "launch")
    for venv in venvs:
        python = root / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text("#!/bin/sh\nexit 1\n")
        python.chmod(0o755)
    return root / "launch"


@pytest.mark.parametrize("venvs, engine, expected", [
    ((".venv", ".venv-gpu"), "--gpu", ".venv-gpu/bin/python"),
    ((".venv",), "--gpu", "python3"),  # NVIDIA's sglang-runtime image: the system python
    ((".venv", ".venv-gpu"), "--cpu", ".venv/bin/python"),
    ((".venv", ".venv-gpu"), "--sglang-cpu", ".venv/bin/python"),
    ((".venv-gpu",), "--cpu", "python3"),
])
@pytest.mark.parametrize("script", ["disagg.sh", "agg.sh"])
def test_the_python_is_the_environment_with_cuda_on_gpus(tmp_path, script, venvs, engine,
                                                         expected):
    launch_dir = repo_copy(tmp_path, venvs)
    lines = dry_lines(fake_gpus(tmp_path, 2), engine, "--model", "/m", script=script,
                      launch_dir=launch_dir)
    want = expected if expected == "python3" else str(launch_dir.parent / expected)
    for role, argv in lines.items():
        python = argv[argv.index("-m") - 1]
        assert python == want, role


def test_a_python_given_in_the_environment_wins(tmp_path):
    launch_dir = repo_copy(tmp_path, (".venv", ".venv-gpu"))
    env = fake_gpus(tmp_path, 2) | {"PYTHON": "/opt/py/bin/python3"}
    for engine in ("--gpu", "--cpu"):
        lines = dry_lines(env, engine, "--model", "/m", launch_dir=launch_dir)
        assert {argv[argv.index("-m") - 1] for argv in lines.values()} == {"/opt/py/bin/python3"}


def recording_python(tmp_path: Path, body: str) -> Path:
    """A stub python that appends its argv (and CUDA_VISIBLE_DEVICES) to calls.log, then runs
    `body` (sh)."""
    python = tmp_path / "py" / "python"
    python.parent.mkdir()
    python.write_text('#!/bin/sh\necho "CVD=${CUDA_VISIBLE_DEVICES-unset} $*" >> '
                      f'"{tmp_path}/calls.log"\n{body}\n')
    python.chmod(0o755)
    return python


def test_a_python_without_sglang_is_refused_before_anything_starts(tmp_path):
    python = recording_python(
        tmp_path, "echo \"ModuleNotFoundError: No module named 'sglang'\" >&2; exit 1")
    env = fake_gpus(tmp_path, 2) | {"PYTHON": str(python), "LOG_DIR": str(tmp_path / "logs")}
    done = launch(env, "--gpu", "--model", "/m")
    assert done.returncode == 1
    assert f"{python} cannot run SGLang on GPUs: ModuleNotFoundError: No module named 'sglang'" \
        in done.stderr
    assert "make install-gpu" in done.stderr and "PYTHON=" in done.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 1 and " -c " in calls[0]  # the check; no frontend, no worker
    assert not (tmp_path / "logs").exists()


def test_the_cpu_only_venv_is_refused_on_gpus_saying_torch_sees_no_cuda(tmp_path):
    cpu_python = REPO / ".venv" / "bin" / "python"
    if not cpu_python.exists():
        pytest.skip("no .venv here")
    env = fake_gpus(tmp_path, 2) | {"PYTHON": str(cpu_python)}
    done = launch(env, "--gpu", "--model", "/m")
    assert done.returncode == 1, done.stderr
    assert f"{cpu_python} cannot run SGLang on GPUs" in done.stderr
    assert "sees no CUDA GPU" in done.stderr and "make install-gpu" in done.stderr


def test_a_python_that_passes_the_check_starts_the_workers_on_their_gpus(tmp_path):
    # The stub passes the check and exits at once as every process: the launch then stops,
    # saying a process exited during startup.
    python = recording_python(tmp_path, "exit 0")
    env = fake_gpus(tmp_path, 8) | {"PYTHON": str(python), "CUDA_VISIBLE_DEVICES": "2,3,5,7",
                                    "LOG_DIR": str(tmp_path / "logs"), "READY_TIMEOUT": "30",
                                    "STOP_TIMEOUT": "5", "DYN_FILE_KV": str(tmp_path / "kv")}
    done = launch(env, "--gpu", "--model", "/m", "--", "--tp", "2")
    assert done.returncode != 0 and "exited during startup" in done.stderr, done.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert " -c " in calls[0]  # the check came first
    assert any("-m dynamo.frontend" in line for line in calls[1:])
    prefill = [line for line in calls if "--disaggregation-mode prefill" in line]
    decode = [line for line in calls if "--disaggregation-mode decode" in line]
    assert len(prefill) == len(decode) == 1
    assert prefill[0].startswith("CVD=2,3 ") and decode[0].startswith("CVD=5,7 ")


def test_prefill_gpu_and_decode_gpu_still_move_the_default_blocks(tmp_path):
    env = fake_gpus(tmp_path, 8) | {"PREFILL_GPU": "2"}
    assert devices(dry_lines(env, "--gpu", "--", "--tp", "2")) == {"prefill": "2,3",
                                                                   "decode": "4,5"}
    env["DECODE_GPU"] = "6"
    assert devices(dry_lines(env, "--gpu")) == {"prefill": "2", "decode": "6"}


@pytest.mark.parametrize("script, flags", [
    ("disagg.sh", ("--prefill-gpus", "--decode-gpus", "--prefill-args", "--decode-args")),
    ("agg.sh", ("--gpus",)),
])
def test_the_usage_texts_explain_the_gpu_options(script, flags):
    text = launch(dict(os.environ), "--help", script=script).stdout
    for word in (*flags, ".venv-gpu", "make install-gpu", "CUDA_VISIBLE_DEVICES",
                 "--enable-dp-attention"):
        assert word in text, word
