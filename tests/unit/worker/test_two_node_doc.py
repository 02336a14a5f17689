"""launch/two-node.md's worker lines stay runnable: every `python -m components ...` line in its
code blocks and tables goes through the worker's own parser (`--engine sglang`: with the real
SGLang ServerArgs), so the doc cannot drift from the flags the worker takes."""

from __future__ import annotations

import re
import shlex

import pytest

from components.backends import select as backend_select
from components.engine.config import EngineConfig
from components.worker.flags.config import WorkerMode, parse_args
from tests.unit.worker.test_launch_flags import LAUNCH, with_model, worker_args

pytestmark = pytest.mark.timeout(120)

DOC = LAUNCH / "two-node.md"
ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
# What the doc's `SECRET=$(openssl rand -hex 32)` gives the shell
SHELL_VARS = {"$SECRET": "0123456789abcdef" * 4}


def doc_commands() -> list[list[str]]:
    """Every shell command of the doc's ```bash blocks (continuations joined) and of its inline
    code spans (tables), as words."""
    text = DOC.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += re.findall(r"`([^`\n]+)`", prose)
    return [shlex.split(c, comments=True) for c in commands if c.strip()]


def worker_lines() -> list[tuple[dict[str, str], list[str]]]:
    """(the line's environment assignments, the worker's args) for each `python -m components`."""
    lines = []
    for words in doc_commands():
        if "components" not in words:
            continue
        env = {}
        while ENV_WORD.match(words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        assert words[:3] == ["python", "-m", "components"], words
        lines.append((env, [SHELL_VARS.get(w, w) for w in worker_args(words)]))
    return lines


def engine_of(args: list[str]) -> str:
    return args[args.index("--engine") + 1]


@pytest.fixture(autouse=True)
def _cuda(monkeypatch):
    # Parsing only: `--engine sglang` needs CUDA to be chosen, never to parse.
    monkeypatch.setattr(backend_select, "cuda_available", lambda: True)


def test_the_doc_shows_gpu_prefill_and_decode_lines_and_a_cpu_variant():
    kinds = {(engine_of(args), args[args.index("--disaggregation-mode") + 1])
             for _, args in worker_lines()}
    assert {("sglang", "prefill"), ("sglang", "decode"), ("cpu", "prefill")} <= kinds


def test_every_sglang_line_parses_with_the_real_server_args(tiny_model_path):
    sglang = [(env, args) for env, args in worker_lines() if engine_of(args) == "sglang"]
    assert sglang
    for env, args in sglang:
        config = parse_args(with_model(args, tiny_model_path))
        server_args = config.engine_args  # sglang.srt.server_args.ServerArgs, validated
        assert type(server_args).__name__ == "ServerArgs"
        # SGLang's default backend is mooncake; these workers move KV with NIXL
        assert server_args.disaggregation_transfer_backend == "nixl"
        # Across nodes: a reachable --host, and SGLang's KV managers on the same address
        assert server_args.host not in ("127.0.0.1", "localhost")
        assert env["SGLANG_HOST_IP"] == server_args.host
        assert env["CUDA_VISIBLE_DEVICES"]
        assert config.role.skip_tokenizer_init and config.role.frontend_orchestrated
        assert server_args.page_size == 16
        assert not [a for a in args if a.startswith("--cpu-")]  # CPU-engine-only flags


def test_the_prefill_lines_fix_the_ports_the_reachability_table_names(tiny_model_path):
    text = DOC.read_text()
    for env, args in worker_lines():
        config = parse_args(with_model(args, tiny_model_path))
        if config.role.mode is not WorkerMode.PREFILL:
            continue
        # The reachability table's rows, with the address and ports the lines give
        assert f"prefill bootstrap `{config.host}:{config.bootstrap_port}`" in text
        room_watch_port = config.dynamo.room_watch_port
        assert room_watch_port
        assert f"prefill room watch `{config.host}:{room_watch_port}`" in text


def test_the_cpu_variant_builds_a_valid_cpu_engine_config(tiny_model_path):
    cpu = [args for _, args in worker_lines() if engine_of(args) == "cpu"]
    assert cpu
    for args in cpu:
        config = parse_args(with_model(args, tiny_model_path))
        assert config.backend.name == "cpu"
        engine = EngineConfig.from_kwargs(**config.engine_args)
        assert engine.disaggregation_transfer_backend == "nixl"
        assert engine.kv_ucx_error_handling == "peer"
        assert engine.kv_side_channel_secret == SHELL_VARS["$SECRET"]


def test_the_cpu_only_flags_the_doc_names_are_refused_on_sglang(tiny_model_path):
    (env, args) = next((e, a) for e, a in worker_lines() if engine_of(a) == "sglang")
    for flag, value in (("--cpu-kv-side-channel-secret", "s"), ("--cpu-kv-ucx-error-handling",
                                                                "peer")):
        assert flag in DOC.read_text()
        with pytest.raises(SystemExit, match=flag):
            parse_args(with_model(args, tiny_model_path) + [flag, value])
