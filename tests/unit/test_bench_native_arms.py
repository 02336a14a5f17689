"""The aiperf benchmark's sglang-native arms (benchmarks/native_arms.py): the command lines they
build, without starting any process."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import native_arms
from benchmarks.aiperf_arms import ARMS, DISAGG, SGLANG_FLAGS
from benchmarks.native_arms import NATIVE_ARMS, NativeArm, native_flags, smg_argv

ENGINE_FLAGS = ("--page-size", "--max-total-tokens", "--context-length", "--max-running-requests",
                "--device", "--attention-backend", "--disable-cuda-graph", "--dtype")


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture
def ports(monkeypatch):
    """free_port hands out 20001, 20002, ... in order."""
    counter = iter(range(20001, 20100))
    monkeypatch.setattr(native_arms, "free_port", lambda: next(counter))


def _arm(name: str) -> NativeArm:
    arm = NativeArm(name, "/models/tiny", "tiny", SGLANG_FLAGS, DISAGG)
    arm.workdir.rmdir()  # nothing is started: no logs
    return arm


def test_arms_lists_the_native_arms():
    assert set(NATIVE_ARMS) == {"sglang-native", "sglang-native-disagg"}
    assert set(NATIVE_ARMS) <= set(ARMS)


def test_native_flags_are_the_other_arms_but_the_tokenizer_skip():
    flags = native_flags(SGLANG_FLAGS)
    assert "--skip-tokenizer-init" not in flags
    assert [f for f in SGLANG_FLAGS if f != "--skip-tokenizer-init"] == flags
    for flag in ENGINE_FLAGS:
        assert flag in flags
    assert _value(flags, "--device") == "cpu" and _value(flags, "--dtype") == "float32"


def test_aggregated_arm(ports):
    arm = _arm("sglang-native")
    argvs = arm.argvs()
    assert set(argvs) == {"worker", "frontend"}
    worker = argvs["worker"]
    assert worker[1:3] == ["-m", "sglang.launch_server"]
    assert _value(worker, "--model-path") == "/models/tiny"
    assert _value(worker, "--served-model-name") == "tiny"
    assert "--disaggregation-mode" not in worker and "--skip-tokenizer-init" not in worker
    router = argvs["frontend"]
    assert router[1] == "launch" and Path(router[0]).name == "smg"
    assert _value(router, "--worker-urls") == f"http://127.0.0.1:{_value(worker, '--port')}"
    assert _value(router, "--port") == str(arm.http_port)
    assert "--pd-disaggregation" not in router and "--disable-health-check" in router
    assert arm.url == f"http://127.0.0.1:{arm.http_port}"


def test_disaggregated_arm(ports):
    arm = _arm("sglang-native-disagg")
    argvs = arm.argvs()
    assert set(argvs) == {"prefill", "decode", "frontend"}
    prefill, decode, router = argvs["prefill"], argvs["decode"], argvs["frontend"]
    assert _value(prefill, "--disaggregation-mode") == "prefill"
    assert _value(decode, "--disaggregation-mode") == "decode"
    for argv in (prefill, decode):
        assert _value(argv, "--disaggregation-transfer-backend") == "nixl"
    assert _value(decode, "--disaggregation-decode-retraction-backup") == "none"
    bootstrap = _value(prefill, "--disaggregation-bootstrap-port")
    i = router.index("--prefill")
    assert "--pd-disaggregation" in router
    assert router[i + 1:i + 3] == [f"http://127.0.0.1:{_value(prefill, '--port')}", bootstrap]
    assert _value(router, "--decode") == f"http://127.0.0.1:{_value(decode, '--port')}"
    ports_used = [_value(prefill, "--port"), _value(decode, "--port"), bootstrap,
                  _value(router, "--port"), _value(router, "--prometheus-port")]
    assert len(set(ports_used)) == len(ports_used)


def test_smg_needs_workers():
    with pytest.raises(ValueError):
        smg_argv(1, 2)


def test_servers_run_on_sglangs_cpu_path(ports):
    env = _arm("sglang-native").env()
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "sglang_cpu" in env["PYTHONPATH"]
    assert env["SGLANG_HOST_IP"] == "127.0.0.1"


def test_missing_smg_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(native_arms, "SMG", tmp_path / "smg")
    assert "make smg" in native_arms.missing_tools()


def test_exactness_compares_token_ids_else_text(monkeypatch):
    answers = {"http://ref": {"token_ids": [1, 2], "text": "ab"},
               "http://same": {"token_ids": [1, 2], "text": "ab"},
               "http://text-only": {"token_ids": None, "text": "ab"},
               "http://other": {"token_ids": [1, 3], "text": "ab"}}
    asked = []

    def answer(url, served, native):
        asked.append((url, native))
        return answers[url]

    monkeypatch.setattr(native_arms, "greedy_answer", answer)
    urls = {"agg-sglang": "http://ref", "sglang-native": "http://same",
            "sglang-native-disagg": "http://text-only", "x": "http://other"}
    problems = native_arms.exactness_problems(urls, "tiny", "agg-sglang")
    assert len(problems) == 1 and problems[0].startswith("x answered [1, 3]")
    # Only SGLang's own server is asked with its `return_token_ids` field.
    assert dict(asked) == {"http://ref": False, "http://same": True, "http://text-only": True,
                           "http://other": False}
