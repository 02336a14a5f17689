"""Tool-call and reasoning parser flags: Dynamo's (`--dyn-*`, registered for the frontend) and
SGLang's (the worker's own, Text mode), checked at startup as Dynamo 1.6.1's worker does."""

import pytest

from components.backends import select as backend_select
from components.backends.limits import EngineLimits
from components.worker.flags.config import parse_args
from components.worker.lifecycle.register import runtime_config_for

pytestmark = pytest.mark.timeout(60)

MODEL = ["--model-path", "/models/tiny"]
LIMITS = EngineLimits(context_length=2048, max_total_num_tokens=4096, max_running_requests=8,
                      page_size=16)


@pytest.fixture(autouse=True)
def _cpu_machine(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    for var in ("ENGINE", "DYN_TOOL_CALL_PARSER", "DYN_REASONING_PARSER"):
        monkeypatch.delenv(var, raising=False)


def test_dynamo_parsers_go_into_the_registered_runtime_config():
    config = parse_args(MODEL + ["--skip-tokenizer-init", "--dyn-tool-call-parser", "hermes",
                                 "--dyn-reasoning-parser", "qwen3"])
    runtime = runtime_config_for(LIMITS, config)
    assert (runtime.tool_call_parser, runtime.reasoning_parser) == ("hermes", "qwen3")
    plain = runtime_config_for(LIMITS, parse_args(MODEL))
    assert (plain.tool_call_parser, plain.reasoning_parser) == (None, None)


@pytest.mark.parametrize("flag", ["--dyn-tool-call-parser", "--dyn-reasoning-parser"])
def test_an_unknown_dynamo_parser_stops_the_worker_naming_flag_and_names(flag):
    with pytest.raises(SystemExit) as err:
        parse_args(MODEL + [flag, "nope"])
    assert f"{flag} 'nope' is not one of Dynamo's parsers" in str(err.value)
    assert "qwen3" in str(err.value)  # a valid name is listed


def test_an_unknown_parser_from_the_environment_is_refused_too(monkeypatch):
    monkeypatch.setenv("DYN_TOOL_CALL_PARSER", "nope")
    with pytest.raises(SystemExit, match="--dyn-tool-call-parser 'nope'"):
        parse_args(MODEL)


def test_native_and_dynamo_tool_call_parsers_are_mutually_exclusive():
    with pytest.raises(SystemExit, match="both --tool-call-parser and --dyn-tool-call-parser"):
        parse_args(MODEL + ["--tool-call-parser", "qwen25", "--dyn-tool-call-parser", "hermes"])


def test_native_and_dynamo_reasoning_parsers_may_be_paired():
    config = parse_args(MODEL + ["--reasoning-parser", "qwen3", "--dyn-reasoning-parser",
                                 "qwen3"])
    assert (config.parsers.reasoning_parser, config.parsers.dyn_reasoning_parser) == (
        "qwen3", "qwen3")


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_an_unknown_sglang_parser_stops_the_worker_naming_sglangs_names(flag):
    with pytest.raises(SystemExit) as err:
        parse_args(MODEL + [flag, "nope"])
    assert f"{flag} 'nope' is not one of SGLang's parsers" in str(err.value)
    assert "qwen25" in str(err.value) or "qwen3" in str(err.value)


def test_json_whitespace_flags_reach_the_parsers():
    config = parse_args(MODEL + ["--tool-call-parser", "qwen25",
                                 "--constrained-json-max-whitespace-cnt", "2"])
    assert config.parsers.json_max_whitespace_cnt == 2 and config.parsers.json_any_whitespace
