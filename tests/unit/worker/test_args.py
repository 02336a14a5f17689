"""Worker flag parsing: roles, endpoints, engine choice, CPU engine kwargs (no Dynamo runtime)."""

import pytest

from components.backends import select as backend_select
from components.worker.flags.config import WorkerMode, parse_args, parse_endpoint
from components.engine.config import EngineConfig

pytestmark = pytest.mark.timeout(30)

MODEL = ["--model-path", "/models/tiny"]


@pytest.fixture(autouse=True)
def _cpu_machine(monkeypatch):
    """Parse as on a machine without CUDA, whatever this one has; no ambient Dynamo env."""
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    for var in ("DYN_NAMESPACE", "ENGINE", "DYN_DISCOVERY_BACKEND", "DYN_REQUEST_PLANE",
                "DYN_DEBUG_ROUTES"):
        monkeypatch.delenv(var, raising=False)


def test_defaults_are_an_aggregated_cpu_worker_like_dynamo():
    cfg = parse_args(MODEL)
    assert cfg.role.mode is WorkerMode.AGGREGATED
    assert cfg.backend.name == "cpu"
    assert cfg.dynamo.endpoint == "dynamo.backend.generate"
    assert cfg.dynamo.prefill_endpoint == "dynamo.prefill.generate"
    assert (cfg.dynamo.discovery_backend, cfg.dynamo.request_plane) == ("file", "tcp")
    assert cfg.served_model_name == "/models/tiny"
    assert cfg.role.skip_tokenizer_init is False
    assert cfg.host == "127.0.0.1"


@pytest.mark.parametrize("mode, role, component", [
    ("null", WorkerMode.AGGREGATED, "backend"),
    ("prefill", WorkerMode.PREFILL, "prefill"),
    ("decode", WorkerMode.DECODE, "backend"),
])
def test_role_follows_disaggregation_mode_and_picks_the_default_endpoint(
        monkeypatch, mode, role, component):
    monkeypatch.setenv("DYN_NAMESPACE", "ns1")
    cfg = parse_args(MODEL + ["--disaggregation-mode", mode])
    assert cfg.role.mode is role
    assert cfg.dynamo.endpoint == f"ns1.{component}.generate"
    assert cfg.dynamo.prefill_endpoint == "ns1.prefill.generate"
    assert cfg.engine_args["disaggregation_mode"] == mode


def test_explicit_endpoints_accept_the_dyn_prefix():
    cfg = parse_args(MODEL + ["--endpoint", "dyn://a.b.c", "--prefill-endpoint", "x.y.z",
                              "--disaggregation-mode", "decode"])
    assert cfg.dynamo.endpoint == "a.b.c"
    assert cfg.dynamo.namespace == "a"
    assert cfg.dynamo.prefill_endpoint == "x.y.z"


@pytest.mark.parametrize("bad", ["dyn://a.b", "a.b.c.d", "dyn://a..c", ""])
def test_a_malformed_endpoint_is_rejected_with_its_value(bad):
    with pytest.raises(SystemExit, match="namespace.component.endpoint"):
        parse_endpoint(bad, "--endpoint")


def test_cpu_engine_kwargs_use_sglang_names_and_build_a_real_engine_config():
    cfg = parse_args(MODEL + [
        "--served-model-name", "tiny", "--skip-tokenizer-init", "--page-size", "8",
        "--context-length", "512", "--max-running-requests", "4", "--max-total-tokens", "4096",
        "--dtype", "float", "--random-seed", "7", "--disaggregation-bootstrap-port", "12345",
        "--cpu-num-threads", "2", "--cpu-transfer-timeout", "5", "--tp", "1",
        "--trust-remote-code",
    ])
    kwargs = dict(cfg.engine_args)
    assert kwargs == {
        "model_path": "/models/tiny", "served_model_name": "tiny", "skip_tokenizer_init": True,
        "disaggregation_mode": "null", "disaggregation_bootstrap_port": 12345,
        "disaggregation_transfer_backend": "nixl", "host": "127.0.0.1", "page_size": 8,
        "context_length": 512, "max_running_requests": 4, "max_total_tokens": 4096,
        "dtype": "float32", "random_seed": 7, "num_threads": 2, "transfer_timeout": 5.0,
    }
    assert EngineConfig.from_kwargs(**kwargs).page_size == 8
    assert cfg.bootstrap_port == 12345 and cfg.served_model_name == "tiny"


def test_unset_engine_knobs_are_left_to_the_engine_defaults():
    kwargs = dict(parse_args(MODEL).engine_args)
    for name in ("page_size", "context_length", "max_total_tokens", "dtype", "num_threads"):
        assert name not in kwargs


def test_an_unset_bootstrap_port_gets_a_free_one_like_dynamo():
    a = parse_args(MODEL + ["--disaggregation-mode", "prefill"])
    assert 1024 <= a.bootstrap_port < 65536
    assert a.engine_args["disaggregation_bootstrap_port"] == a.bootstrap_port


@pytest.mark.parametrize("argv, message", [
    (["--tp-size", "2"], "single rank"),
    (["--tokenizer-path", "/elsewhere"], "tokenizer"),
    (["--migration-limit", "-1"], "migration-limit"),
])
def test_what_the_cpu_engine_cannot_do_fails_loudly(argv, message):
    with pytest.raises(SystemExit, match=message):
        parse_args(MODEL + argv)


def test_a_flag_sglang_does_not_accept_with_this_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(MODEL + ["--disaggregation-transfer-backend", "mooncake"])
    assert "disaggregation-transfer-backend" in capsys.readouterr().err


def test_engine_sglang_without_cuda_says_why():
    with pytest.raises(SystemExit, match="CUDA"):
        parse_args(MODEL + ["--engine", "sglang"])


def test_engine_choice_is_made_in_one_place(monkeypatch):
    monkeypatch.setattr(backend_select, "sglang_importable", lambda: True)
    assert backend_select.select_backend("auto").name == "cpu"
    monkeypatch.setattr(backend_select, "cuda_available", lambda: True)
    assert backend_select.select_backend("auto").name == "sglang"
    assert backend_select.select_backend("cpu").name == "cpu"
    monkeypatch.setattr(backend_select, "sglang_importable", lambda: False)
    assert backend_select.select_backend("auto").name == "cpu"
    monkeypatch.setenv("ENGINE", "cpu")
    assert parse_args(MODEL).backend.name == "cpu"


def test_tokenizer_worker_num_reaches_the_engine_and_counts_processes():
    config = parse_args([*MODEL, "--tokenizer-worker-num", "3"])
    assert EngineConfig(**config.engine_args).tokenizer_worker_num == 3
    assert config.backend.tokenizer_worker_count(config.engine_args) == 3
    assert config.backend.tokenizer_worker_count(parse_args(MODEL).engine_args) == 1
    with pytest.raises(ValueError, match="tokenizer_worker_num"):
        EngineConfig(model_path="m", tokenizer_worker_num=0)
