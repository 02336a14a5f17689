"""The SGLang side of the worker without starting SGLang: the resolved config registered, the
speculative reserve kept out of the default budget, `--config` honoured, the bootstrap host as
SGLang resolves it, prefill warm-up before serving, and SIGTERM kept by the worker."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from types import SimpleNamespace

import pytest

from components.backends import select as backend_select
from components.backends.sglang import SglangBackend
from components.worker.flags.config import build_parser, parse_args
from components.worker.role import Orchestrator, WorkerMode, WorkerRole

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sglang_on_cpu(monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)


def sglang_args(model: str, *extra: str):
    from components.backends.sglang_engine import server_args_from_namespace

    ns = build_parser(SglangBackend()).parse_args(["--model-path", model, *extra])
    return server_args_from_namespace(ns)


def fake_engine(server_args, context_len=2048, reserved=0):
    manager = SimpleNamespace(context_len=context_len, num_reserved_tokens=reserved,
                              tokenizer=None, model_config=SimpleNamespace(vocab_size=100))
    info = {"max_total_num_tokens": 4096, "max_running_requests": 8}
    return SimpleNamespace(server_args=server_args, tokenizer_manager=manager,
                           _scheduler_init_result=SimpleNamespace(scheduler_infos=[info]))


def test_sglang_cpu_path_is_chosen_by_sglangs_own_switch(sglang_on_cpu, tiny_model_path):
    config = parse_args(["--engine", "sglang", "--model-path", tiny_model_path])
    assert config.backend.name == "sglang"
    args = config.engine_args
    assert (args.device, args.attention_backend, args.dtype) == ("cpu", "torch_native", "float32")
    assert args.disable_cuda_graph is True and args.max_total_tokens == 4096
    decode = parse_args(["--engine", "sglang", "--model-path", tiny_model_path,
                         "--disaggregation-mode", "decode", "--max-total-tokens", "9000"])
    assert decode.engine_args.disaggregation_decode_retraction_backup == "none"
    assert decode.engine_args.max_total_tokens == 9000


def test_registration_reads_the_page_size_sglang_resolved(tiny_model_path):
    from sglang.srt.arg_groups.overrides import declare_resolution

    from components.backends.sglang_engine import sglang_limits

    server_args = sglang_args(tiny_model_path)
    assert server_args.page_size is None  # as given: no --page-size
    # What an attention backend that needs whole pages declares during engine start-up.
    declare_resolution(server_args, "attention backend", page_size=64)
    assert sglang_limits(fake_engine(server_args)).page_size == 64


def test_speculative_reserve_is_kept_out_of_the_default_budget(tiny_model_path):
    from components.worker.handler_factory import build_handler
    from components.backends.sglang_engine import sglang_limits

    engine = fake_engine(sglang_args(tiny_model_path), context_len=2048, reserved=16)
    assert sglang_limits(engine).context_length == 2048  # registered as the model's context
    config = SimpleNamespace(role=WorkerRole(WorkerMode.AGGREGATED, Orchestrator.DECODE, True),
                             backend=SglangBackend(), served_model_name="m",
                             dynamo=SimpleNamespace(prefill_wait_timeout=5.0))
    handler = build_handler(config, engine, None)
    # SGLang refuses prompt + max_new_tokens + 16 > 2048; the default budget must fit.
    assert handler.config.context_length == 2048 - 16


def test_config_file_settings_are_applied(sglang_on_cpu, tiny_model_path, tmp_path):
    config_file = tmp_path / "engine.yaml"
    config_file.write_text("page-size: 32\nmax-running-requests: 7\n")
    base = ["--engine", "sglang", "--model-path", tiny_model_path]
    args = parse_args([*base, "--config", str(config_file)]).engine_args
    assert (args.page_size, args.max_running_requests) == (32, 7)
    args = parse_args([*base, f"--config={config_file}", "--page-size", "16"]).engine_args
    assert args.page_size == 16  # the command line wins over the file


def test_missing_config_file_is_an_error_naming_it(sglang_on_cpu, tiny_model_path, tmp_path):
    with pytest.raises(SystemExit, match="nope.yaml"):
        parse_args(["--engine", "sglang", "--model-path", tiny_model_path,
                    "--config", str(tmp_path / "nope.yaml")])


def test_wildcard_host_advertises_the_address_sglang_resolves(monkeypatch, tiny_model_path):
    from components.worker.handler_factory import build_handler

    monkeypatch.setenv("SGLANG_HOST_IP", "10.9.8.7")  # what SGLang's get_local_ip_auto honours
    config = SimpleNamespace(role=WorkerRole(WorkerMode.PREFILL, Orchestrator.FRONTEND, True),
                             backend=SglangBackend(), host="0.0.0.0")
    engine = SimpleNamespace(server_args=SimpleNamespace(disaggregation_bootstrap_port=8998))
    handler = build_handler(config, engine, None)
    assert (handler.config.bootstrap_host, handler.config.bootstrap_port) == ("10.9.8.7", 8998)


@pytest.mark.parametrize("layout, ranks", [
    ({}, [0]), ({"dp_size": 2}, [0, 1]),
    ({"dp_size": 1, "attn_dp_size": 2}, [0, 1]),  # SGLang 0.5.23's resolved --enable-dp-attention
])
async def test_sglang_prefill_warms_every_dp_rank_through_the_fake_bootstrap_host(layout, ranks):
    """As Dynamo 1.6.1's `warmup_prefill_engine`: one request per DP rank, each routed to its
    rank, with 1.6.1's 1800 s bound."""
    from components.backends import sglang_engine
    from components.worker.main import warmup_prefill

    calls = []

    class Engine:
        server_args = SimpleNamespace(disaggregation_bootstrap_port=8998, **layout)

        async def async_generate(self, **kwargs):
            calls.append(kwargs)

            async def stream():
                yield {"meta_info": {"finish_reason": {"type": "length"}}}
            return stream()

    config = SimpleNamespace(backend=SglangBackend())
    await warmup_prefill(config, Engine())
    assert sorted(call["routed_dp_rank"] for call in calls) == ranks
    assert len({call["bootstrap_room"] for call in calls}) == len(ranks)
    assert all(call["bootstrap_host"] == "2.2.2.2" and call["bootstrap_port"] == 8998
               and call["stream"] is True for call in calls)
    assert sglang_engine.PREFILL_WARMUP_TIMEOUT_S == 1800.0


async def test_signal_guard_keeps_the_workers_sigterm_handler():
    from components.worker.lifecycle.signal_guard import SignalGuard

    loop = asyncio.get_running_loop()
    got: list[str] = []
    woke = asyncio.Event()
    try:
        SignalGuard(loop).take(lambda: (got.append("worker"), woke.set()))
        # What SGLang's TokenizerManager does on its first request.
        loop.add_signal_handler(signal.SIGTERM, lambda: got.append("sglang"))
        loop.add_signal_handler(signal.SIGUSR1, lambda: (got.append("usr1"), woke.set()))
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(woke.wait(), 5)
        woke.clear()
        os.kill(os.getpid(), signal.SIGUSR1)  # other signals still register normally
        await asyncio.wait_for(woke.wait(), 5)
        assert got == ["worker", "usr1"]
    finally:
        del loop.add_signal_handler
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


@pytest.mark.parametrize("extra, engine_skips", [
    ((), False), (("--grammar-backend", "xgrammar"), False), (("--grammar-backend", "none"), True)])
def test_tokens_mode_keeps_sglangs_tokenizer_for_its_grammar_backend(
        sglang_on_cpu, tiny_model_path, extra, engine_skips):
    """SGLang builds its grammar backend from its tokenizer: Tokens mode keeps it loaded (ids
    still go in and out) unless the grammar backend is off; the worker's mode is unchanged."""
    config = parse_args(["--engine", "sglang", "--model-path", tiny_model_path,
                         "--skip-tokenizer-init", *extra])
    assert config.role.skip_tokenizer_init is True
    assert config.engine_args.skip_tokenizer_init is engine_skips
    text = parse_args(["--engine", "sglang", "--model-path", tiny_model_path, *extra])
    assert text.role.skip_tokenizer_init is False and text.engine_args.skip_tokenizer_init is False


def test_dp_layout_and_eagle_are_registered_as_dynamo_does(tiny_model_path):
    """`data_parallel_size` from SGLang's --dp-size and `enable_eagle` from SGLang's own
    `SpeculativeAlgorithm.is_eagle` (EAGLE, EAGLE3 and NEXTN key their radix cache by bigrams)."""
    from components.backends.sglang_engine import eagle_enabled, sglang_limits
    from components.worker.lifecycle.register import runtime_config_for

    assert [eagle_enabled(a) for a in (None, "EAGLE", "EAGLE3", "NEXTN", "NGRAM")] == [
        False, True, True, True, False]
    with pytest.raises(SystemExit, match="--speculative-algorithm 'BOGUS'"):
        eagle_enabled("BOGUS")
    limits = sglang_limits(fake_engine(sglang_args(tiny_model_path, "--dp-size", "2")))
    assert (limits.dp_size, limits.enable_eagle) == (2, False)
    runtime = runtime_config_for(dataclasses.replace(limits, enable_eagle=True))
    assert (runtime.data_parallel_start_rank, runtime.data_parallel_size) == (0, 2)
    assert runtime.enable_eagle is True
