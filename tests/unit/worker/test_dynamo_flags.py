"""Dynamo 1.6.1's launch line on this worker: every flag of `python -m dynamo.sglang --help` is
accepted or refused naming itself, 1.6.1's documented launch examples parse on both engines, and
the flags that shape registration reach the model card as 1.6.1's worker puts them there."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from types import SimpleNamespace

import pytest
from dynamo.llm import ModelType

from components.backends import select as backend_select
from components.backends.limits import EngineLimits
from components.backends.sglang import SglangBackend
from components.worker.lifecycle import register
from components.worker.metrics import kv_events
from components.worker.flags.config import build_parser, parse_args
from components.worker.flags.config_dump import dump_worker_config
from components.worker.flags.dynamo_flag_table import HANDLED_ELSEWHERE

pytestmark = pytest.mark.timeout(120)

LIMITS = EngineLimits(context_length=2048, max_total_num_tokens=4096, max_running_requests=8,
                      page_size=16, max_num_batched_tokens=8192)

# The worker lines of Dynamo's SGLang launch examples (ai-dynamo/dynamo,
# examples/backends/sglang/launch/: agg.sh, agg_router.sh, disagg.sh, disagg_router.sh; the wheel
# ships none), verbatim but for the model, which is the tiny test model here.
KV_EVENTS = "'{\"publisher\":\"zmq\",\"topic\":\"kv-events\",\"endpoint\":\"tcp://*:5557\"}'"
COMMON = "--model-path M --served-model-name M --tp 1 --trust-remote-code"
EXAMPLES = {
    "agg": f"{COMMON} --page-size 16 --skip-tokenizer-init --enable-metrics",
    "agg_router": f"{COMMON} --page-size 16 --kv-events-config {KV_EVENTS} --enable-metrics",
    "disagg_prefill": f"{COMMON} --page-size 16 --disaggregation-mode prefill "
                      "--disaggregation-bootstrap-port 12345 --host 0.0.0.0 "
                      "--disaggregation-transfer-backend nixl --enable-metrics",
    "disagg_decode": f"{COMMON} --page-size 16 --disaggregation-mode decode "
                     "--disaggregation-bootstrap-port 12345 --host 0.0.0.0 "
                     "--disaggregation-transfer-backend nixl --enable-metrics",
    "disagg_router_prefill": f"{COMMON} --page-size 64 --disaggregation-mode prefill "
                             f"--host 0.0.0.0 --kv-events-config {KV_EVENTS} "
                             "--disaggregation-transfer-backend nixl --enable-metrics",
    "disagg_router_decode": f"{COMMON} --page-size 64 --disaggregation-mode decode "
                            f"--host 0.0.0.0 --kv-events-config {KV_EVENTS} "
                            "--disaggregation-transfer-backend nixl --enable-metrics",
}
# The one change a 1.6.1 line needs here (docs/compatibility.md, "Launch line"): 1.6.1 serves
# Tokens mode unless --use-sglang-tokenizer; this worker takes the mode from
# --skip-tokenizer-init, and only Tokens mode can be frontend-orchestrated.
TOKENS_MODE = "--skip-tokenizer-init"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    # The TLS flags export variables for Dynamo's runtime: keep them out of other tests.
    monkeypatch.setattr(os, "environ", dict(os.environ))


def dynamo_1_6_1_parser() -> argparse.ArgumentParser:
    """1.6.1's `python -m dynamo.sglang` parser as its `args.parse_args` assembles it (--help)."""
    from dynamo.common.configuration.groups.router_args import register_worker_router_help
    from dynamo.common.configuration.groups.runtime_args import DynamoRuntimeArgGroup
    from dynamo.sglang._compat import add_sglang_cli_compat
    from dynamo.sglang.backend_args import DynamoSGLangArgGroup
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=True)
    DynamoRuntimeArgGroup().add_arguments(parser)
    DynamoSGLangArgGroup().add_arguments(parser)
    register_worker_router_help(parser)
    sglang = parser.add_argument_group("SGLang")
    sglang_only = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(sglang_only)
    add_sglang_cli_compat(sglang_only)
    sglang._group_actions.extend(a for a in sglang_only._actions if a.option_strings)
    return parser


def _sample(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    if isinstance(action.default, (str, int, float)) and not isinstance(action.default, bool) \
            and action.default != argparse.SUPPRESS:
        return [str(action.default)]  # a value 1.6.1 takes
    return ["x"] if action.type in (None, str) else ["1"]


def _sglang_flags() -> set[str]:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(p)
    return set(p._option_string_actions)


# 1.6.1's parser warns of its own deprecated router flags (--load-aware, ...), as it does there.
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_every_flag_of_1_6_1s_worker_is_accepted_or_refused_by_name(tiny_model_path, capsys):
    """SGLang's own flags are the real ServerArgs' on --engine sglang; each Dynamo flag, given a
    value its parser takes, parses (CPU engine) or stops the worker with a message naming it."""
    sglang = _sglang_flags() | {"--disable-piecewise-cuda-graph"}
    ours = build_parser(SglangBackend())
    assert sglang <= set(ours._option_string_actions)
    base = ["--engine", "cpu", "--model-path", tiny_model_path, "--skip-tokenizer-init"]
    seen, refused = set(), {}
    for group in dynamo_1_6_1_parser()._action_groups:
        for action in group._group_actions:
            for flag in action.option_strings:
                if flag in sglang or flag in ("-h", "--help", "--version") or flag in seen:
                    continue
                seen.add(flag)
                try:
                    parse_args([*base, flag, *_sample(action)])
                except SystemExit as exc:
                    # argparse's own refusals (exit 2) print "argument --flag: ..." instead
                    said = str(exc) + capsys.readouterr().err
                    named = any(s in said for s in action.option_strings)
                    assert named, f"{flag}: refused without its name: {exc}"
                    refused[flag] = str(exc)
    assert len(seen) > 100  # 1.6.1's Dynamo, Dynamo-SGLang and router advertisement flags
    accepted = seen - set(refused)
    assert {"--namespace", "--endpoint-types", "--dump-config-to", "--router-mode",
            "--gateway-workers", "--no-fpm-trace", "--tcp-tls-cert-path"} <= accepted
    assert {"--rerank-worker", "--fpm-trace", "--engine-route"} <= set(refused)
    assert set(HANDLED_ELSEWHERE) <= seen


@pytest.mark.parametrize("engine", ["cpu", "sglang"])
def test_enable_multimodal_is_refused_on_both_engines(monkeypatch, tiny_model_path, engine):
    """1.6.1's flag and SGLang's spelling at once: refused before any engine starts."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    with pytest.raises(SystemExit, match="--enable-multimodal is not supported"):
        parse_args(["--engine", engine, "--model-path", tiny_model_path, "--enable-multimodal"])


def test_an_sglang_flag_the_cpu_engine_lacks_is_refused_naming_it(tiny_model_path):
    with pytest.raises(SystemExit, match="--enable-lora: not flags of this worker on the cpu"):
        parse_args(["--engine", "cpu", "--model-path", tiny_model_path, "--enable-lora"])


@pytest.mark.parametrize("engine", ["cpu", "sglang"])
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_1_6_1_launch_examples_start_this_worker(monkeypatch, tiny_model_path, engine, example):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    argv = shlex.split(EXAMPLES[example].replace(" M ", f" {tiny_model_path} "))
    if TOKENS_MODE not in argv:
        argv.append(TOKENS_MODE)
    config = parse_args(["--engine", engine, *argv])
    assert config.served_model_name == tiny_model_path and config.backend.name == engine
    mode = example.split("_")[-1] if example.startswith("disagg") else "agg"
    assert config.role.mode.value == mode
    if "router" in example:
        assert "tcp://*:5557" in config.kv_events_config
    if mode != "agg":
        assert config.role.frontend_orchestrated
    if example in ("disagg_prefill", "disagg_decode"):
        assert config.bootstrap_port == 12345


async def _registered(monkeypatch, *flags: str, mode: str = "null") -> dict:
    calls = []

    async def fake_register_model(*args, **kwargs):
        calls.append({"args": args, **kwargs})

    monkeypatch.setattr(register, "register_model", fake_register_model)
    cfg = parse_args(["--model-path", "/models/tiny", "--disaggregation-mode", mode, *flags])
    await register.register_served_model(object(), cfg, LIMITS, ("10.0.0.7", 12345))
    return calls[0]


async def test_several_served_names_register_the_rest_as_aliases(monkeypatch):
    call = await _registered(monkeypatch, "--served-model-name", "tiny tiny-a,tiny-b",
                             "--skip-tokenizer-init")
    assert call["args"][4] == "tiny" and call["model_aliases"] == ["tiny-a", "tiny-b"]


async def test_custom_template_endpoint_types_and_router_reach_the_card(monkeypatch, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    call = await _registered(monkeypatch, "--skip-tokenizer-init", "--custom-jinja-template",
                             str(template), "--endpoint-types", "chat", "--router-mode", "kv")
    assert call["custom_template_path"] == str(template)
    assert call["args"][1] == ModelType.Chat
    assert call["router_config"] is not None
    assert call["runtime_config"].max_num_batched_tokens == 8192
    plain = await _registered(monkeypatch, "--skip-tokenizer-init", "--endpoint-types", "none")
    assert plain["args"][1] == ModelType.Empty and plain["router_config"] is None


@pytest.mark.parametrize("mode, indexer", [("null", True), ("prefill", True), ("decode", False)])
async def test_a_decode_worker_advertises_no_local_indexer(monkeypatch, mode, indexer):
    call = await _registered(monkeypatch, "--skip-tokenizer-init", "--disagg-orchestrator",
                             "frontend", mode=mode)
    assert call["runtime_config"].enable_local_indexer is indexer


@pytest.mark.parametrize("over_zmq", [False, True])
async def test_the_kv_publisher_serves_the_local_indexer_the_card_advertises(monkeypatch,
                                                                             over_zmq):
    """1.6.1 hands its publisher the card's enable_local_indexer; both engines' paths do here."""
    made = []

    class Publisher:
        def __init__(self, **kwargs):
            made.append(kwargs)

        def shutdown(self):
            pass

    class Metrics:
        async def create_endpoint(self, endpoint):
            pass

        def publish(self, *args, **kwargs):
            pass

    monkeypatch.setattr(kv_events, "KvEventPublisher", Publisher)
    monkeypatch.setattr(kv_events, "WorkerMetricsPublisher", Metrics)
    publishing = kv_events.KvPublishing()
    backend = SimpleNamespace(kv_events_over_zmq=over_zmq, kv_event_dp_ranks=lambda e: range(2),
                              kv_used_blocks=lambda engine, page: None)
    await publishing.start(object(), backend,
                           SimpleNamespace(set_kv_event_listener=lambda relay: None), 16,
                           '{"publisher": "zmq", "endpoint": "tcp://*:5557"}', local_indexer=True)
    publishing.close()
    assert made and all(kw["enable_local_indexer"] is True for kw in made)
    if over_zmq:  # as 1.6.1: one relay per local DP rank, from the port SGLang gives that rank
        assert [(kw["dp_rank"], kw["zmq_endpoint"]) for kw in made] == [
            (0, "tcp://127.0.0.1:5557"), (1, "tcp://127.0.0.1:5558")]


def test_text_mode_refuses_what_only_the_frontend_applies(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("x")
    base = ["--engine", "cpu", "--model-path", "/models/tiny"]
    with pytest.raises(SystemExit, match="--custom-jinja-template needs --skip-tokenizer-init"):
        parse_args([*base, "--custom-jinja-template", str(template)])
    with pytest.raises(SystemExit, match="--endpoint-types completions needs"):
        parse_args([*base, "--endpoint-types", "completions"])
    with pytest.raises(SystemExit, match="--use-sglang-tokenizer"):
        parse_args([*base, "--use-sglang-tokenizer", "--skip-tokenizer-init"])


def test_gateway_workers_is_tokenizer_worker_num():
    base = ["--engine", "cpu", "--model-path", "/models/tiny"]
    assert parse_args([*base, "--gateway-workers", "2"]).engine_args["tokenizer_worker_num"] == 2
    with pytest.raises(SystemExit, match="--gateway-workers 2 and --tokenizer-worker-num 3"):
        parse_args([*base, "--gateway-workers", "2", "--tokenizer-worker-num", "3"])


def test_tls_flags_set_the_runtimes_variables():
    parse_args(["--engine", "cpu", "--model-path", "/models/tiny", "--tcp-tls-cert-path",
                "/c.pem", "--tcp-tls-insecure", "--response-plane", "tcp"])
    assert os.environ["DYN_TCP_TLS_CERT_PATH"] == "/c.pem"
    assert os.environ["DYN_TCP_TLS_INSECURE"] == "1" and os.environ["DYN_RESPONSE_PLANE"] == "tcp"


def test_dump_config_to_writes_the_resolved_config_without_secrets(tmp_path):
    out = tmp_path / "dump" / "config.json"
    config = parse_args(["--engine", "cpu", "--model-path", "/models/tiny", "--dump-config-to",
                         str(out), "--cpu-kv-side-channel-secret", "hush", "--namespace", "ns1"])
    dump_worker_config(config)
    dumped = json.loads(out.read_text())["config"]
    assert dumped["dynamo"]["endpoint"] == "ns1.backend.generate"
    assert dumped["engine_args"]["kv_side_channel_secret"] == "<redacted>"
    assert "hush" not in out.read_text()
