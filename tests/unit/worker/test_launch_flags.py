"""The worker lines of launch/*.sh parse with the real SGLang ServerArgs (GPU and CPU lines),
and the CPU lines also with the CPU engine's parser into a valid EngineConfig."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from components.backends import select as backend_select
from components.backends.sglang import SglangBackend
from components.worker.flags.config import build_parser, parse_args
from components.engine.config import EngineConfig

pytestmark = pytest.mark.timeout(120)

LAUNCH = Path(__file__).resolve().parents[3] / "launch"
# A GPU launch checks that its GPUs exist: these dry runs see 8, whatever this machine has.
GPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def dry_run(script: str, *flags: str) -> dict[str, list[str]]:
    """{'frontend': argv, 'prefill': argv, ...} as the script would run them."""
    out = subprocess.run([str(LAUNCH / script), "--dry-run", *flags], check=True, env=GPU_ENV,
                         capture_output=True, text=True, timeout=30).stdout
    lines = {}
    for line in out.splitlines():
        role, _, cmd = line.partition(":")
        lines[role] = shlex.split(cmd)
    return lines


def worker_args(argv: list[str]) -> list[str]:
    """The flags after `-m components` (skipping any `env VAR=...` prefix)."""
    i = argv.index("components")
    assert argv[i - 1] == "-m"
    return argv[i + 1:]


def with_model(args: list[str], model: str) -> list[str]:
    args = list(args)
    args[args.index("--model-path") + 1] = model
    return args


@pytest.fixture(autouse=True)
def _no_cuda(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)


@pytest.mark.parametrize("engine", ["--gpu", "--cpu"])
@pytest.mark.parametrize("tokens", ["--skip-tokenizer-init", "--no-skip-tokenizer-init"])
def test_disagg_worker_lines_parse_with_real_sglang_server_args(tiny_model_path, engine, tokens):
    from components.backends.sglang_engine import server_args_from_namespace

    lines = dry_run("disagg.sh", engine, tokens, "--bootstrap-port", "12345")
    assert {"frontend", "prefill", "decode"} <= set(lines)
    for role in ("prefill", "decode"):
        argv = with_model(worker_args(lines[role]), tiny_model_path)
        ns = build_parser(SglangBackend()).parse_args(argv)
        server_args = server_args_from_namespace(ns)  # ServerArgs.from_cli_args + validation
        assert server_args.disaggregation_mode == role
        assert server_args.disaggregation_transfer_backend == "nixl"
        assert server_args.disaggregation_bootstrap_port == 12345
        assert ns.skip_tokenizer_init is (tokens == "--skip-tokenizer-init")  # the mode
        # Tokens mode keeps SGLang's tokenizer for its grammar backend (sglang_engine.py)
        assert server_args.skip_tokenizer_init is False
        assert server_args.incremental_streaming_output is True
        assert server_args.page_size == 16
    if engine == "--gpu":
        assert lines["prefill"][:2] == ["env", "CUDA_VISIBLE_DEVICES=0"]
        assert lines["decode"][:2] == ["env", "CUDA_VISIBLE_DEVICES=1"]


@pytest.mark.parametrize("script", ["disagg.sh", "agg.sh"])
def test_cpu_worker_lines_build_a_valid_cpu_engine_config(script, tiny_model_path):
    lines = dry_run(script, "--cpu", "--model", tiny_model_path, "--", "--max-total-tokens", "4096")
    workers = [r for r in lines if r != "frontend"]
    assert workers
    for role in workers:
        cfg = parse_args(worker_args(lines[role]))
        assert cfg.backend.name == "cpu"
        engine_config = EngineConfig.from_kwargs(**cfg.engine_args)
        assert engine_config.max_total_tokens == 4096  # extra args are forwarded
        assert engine_config.skip_tokenizer_init is True


def test_agg_worker_line_parses_with_real_sglang_server_args(tiny_model_path):
    lines = dry_run("agg.sh", "--gpu")
    ns = build_parser(SglangBackend()).parse_args(with_model(worker_args(lines["worker"]),
                                                      tiny_model_path))
    assert ns.disaggregation_mode == "null"


def test_scripts_explain_themselves():
    for script in ("disagg.sh", "agg.sh"):
        out = subprocess.run([str(LAUNCH / script), "--help"], check=True, capture_output=True,
                             text=True, timeout=30).stdout
        assert "--skip-tokenizer-init" in out and "--http-port" in out
        bad = subprocess.run([str(LAUNCH / script), "--no-such-flag"], capture_output=True,
                             text=True, timeout=30)
        assert bad.returncode == 2 and "unknown option --no-such-flag" in bad.stderr


@pytest.mark.parametrize("script", ["agg.sh", "disagg.sh"])
def test_discovery_flags_reach_every_process(script):
    flags = ("--cpu", "--discovery-backend", "etcd", "--request-plane", "nats",
             "--etcd-endpoints", "http://10.0.0.5:2379", "--nats-server", "nats://10.0.0.5:4222")
    lines = dry_run(script, *flags)
    assert set(dry_run_env(script, *flags)) == {"DYN_DISCOVERY_BACKEND=etcd", "DYN_REQUEST_PLANE=nats",
                                     "ETCD_ENDPOINTS=http://10.0.0.5:2379",
                                     "NATS_SERVER=nats://10.0.0.5:4222"}
    for role, argv in lines.items():
        at = argv.index("--discovery-backend")
        assert argv[at:at + 4] == ["--discovery-backend", "etcd", "--request-plane", "nats"], role
    for argv in (worker_args(a) for r, a in lines.items() if r != "frontend"):
        config = parse_args(argv)
        assert (config.dynamo.discovery_backend, config.dynamo.request_plane) == ("etcd", "nats")


def test_file_discovery_stays_the_default():
    assert dry_run_env("disagg.sh", "--cpu") == ["DYN_DISCOVERY_BACKEND=file", "DYN_REQUEST_PLANE=tcp"]
    assert "file" in dry_run("disagg.sh", "--cpu")["frontend"]


def dry_run_env(script: str, *flags: str) -> list[str]:
    """The discovery environment --dry-run reports on stderr (`env: VAR=value ...`)."""
    err = subprocess.run([str(LAUNCH / script), "--dry-run", *flags], check=True, env=GPU_ENV,
                         capture_output=True, text=True, timeout=30).stderr
    (line,) = [ln for ln in err.splitlines() if ln.startswith("env:")]
    return shlex.split(line[len("env:"):])
