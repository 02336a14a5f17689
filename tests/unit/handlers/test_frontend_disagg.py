"""Frontend-orchestrated disaggregation (Dynamo 1.6.1's style) without a runtime: the flag and
its defaults, what each role registers, the prefill leg (the frontend's room, 1.6.1's item
shapes, refusing what decode refuses) and the decode leg (bootstrap_info required)."""

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
from dynamo.llm import ModelInput, ModelType, WorkerType

from components.backends import select as backend_select
from components.worker.lifecycle import register
from components.worker.flags.config import parse_args
from components.backends.limits import EngineLimits
from components.worker.handler_factory import health_check_payload
from handlers import (
    FAKE_BOOTSTRAP_HOST, DecodeConfig, DecodeHandler, PrefillConfig, PrefillHandler,
)
from handlers.core.errors import RequestError
from handlers.disagg.orchestration import Orchestration
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(10)

MODEL = ["--model-path", "/models/tiny", "--served-model-name", "tiny"]
BOOT = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 12345,
        "bootstrap_room": 6067417816877755061,  # one the 1.6.1 frontend drew
        "handoff_id": b"\x01" * 16}  # 1.6.1 adds handoff_id as bytes
FLAT = {"token_ids": [1, 2, 3, 4], "stop_conditions": {"max_tokens": 1},
        "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2],
        "routing": {"prefill_worker_id": 7}, "bootstrap_info": BOOT}
DECODE_REQ = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 2},
              "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2]}
DONE = chunk([9], {"type": "length", "length": 1}, prompt=4, completion=1, cached=2)
LIMITS = EngineLimits(context_length=2048, max_total_num_tokens=4096, max_running_requests=8,
                      page_size=16)


@pytest.fixture(autouse=True)
def _cpu_machine(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.delenv("DYN_DISAGG_ORCHESTRATOR", raising=False)


# --- the flag -----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, expected", [
    (["--skip-tokenizer-init"], "frontend"),  # Tokens mode: Dynamo 1.6.1's style
    ([], "decode"),  # Text mode: the frontend cannot orchestrate it
    (["--skip-tokenizer-init", "--disagg-orchestrator", "decode"], "decode"),
])
def test_orchestrator_defaults_follow_the_input_mode(extra, expected):
    cfg = parse_args([*MODEL, "--disaggregation-mode", "decode", *extra])
    assert cfg.role.orchestrator.value == expected


def test_frontend_style_in_text_mode_fails_at_startup_naming_the_fix():
    with pytest.raises(SystemExit, match="needs --skip-tokenizer-init"):
        parse_args([*MODEL, "--disaggregation-mode", "prefill", "--disagg-orchestrator",
                    "frontend"])


def test_a_bad_orchestrator_from_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("DYN_DISAGG_ORCHESTRATOR", "router")
    with pytest.raises(SystemExit, match="--disagg-orchestrator must be one of"):
        parse_args([*MODEL, "--disaggregation-mode", "decode", "--skip-tokenizer-init"])


# --- registration ---------------------------------------------------------------------------

async def _registered(monkeypatch, mode: str, orchestrator: str, limits=LIMITS) -> dict:
    calls = []

    async def fake_register_model(*args, **kwargs):
        calls.append({"args": args, **kwargs})

    monkeypatch.setattr(register, "register_model", fake_register_model)
    cfg = parse_args([*MODEL, "--disaggregation-mode", mode, "--skip-tokenizer-init",
                      "--disagg-orchestrator", orchestrator])
    await register.register_served_model(object(), cfg, limits, ("10.0.0.7", 12345))
    return calls[0] if calls else {}


async def test_frontend_style_prefill_registers_as_prefill_with_its_bootstrap_endpoint(monkeypatch):
    call = await _registered(monkeypatch, "prefill", "frontend")
    assert call["args"][:2] == (ModelInput.Tokens, ModelType.Prefill)
    assert call["worker_type"] == WorkerType.Prefill
    assert call["needs"] == [[WorkerType.Decode]]
    runtime_config = call["runtime_config"]
    assert (runtime_config.bootstrap_host, runtime_config.bootstrap_port) == ("10.0.0.7", 12345)


async def test_frontend_style_decode_registers_as_decode_needing_prefill(monkeypatch):
    call = await _registered(monkeypatch, "decode", "frontend")
    assert call["args"][0] == ModelInput.Tokens
    assert call["worker_type"] == WorkerType.Decode
    assert call["needs"] == [[WorkerType.Prefill]]
    assert call["runtime_config"].bootstrap_port is None


async def test_decode_style_registers_decode_as_aggregated_and_no_prefill(monkeypatch):
    call = await _registered(monkeypatch, "decode", "decode")
    assert (call["worker_type"], call["needs"]) == (WorkerType.Aggregated, [])
    assert await _registered(monkeypatch, "prefill", "decode") == {}


def test_frontend_style_decode_canary_carries_a_fake_room():
    """No frontend injects bootstrap_info into the runtime's health check: SGLang's fake host
    makes it a local no-op instead of a 400."""
    cfg = parse_args([*MODEL, "--disaggregation-mode", "decode", "--skip-tokenizer-init"])
    engine = SimpleNamespace(tokenizer_manager=SimpleNamespace(tokenizer=None),
                             server_args=SimpleNamespace(disaggregation_bootstrap_port=8998))
    payload = health_check_payload(cfg, engine)
    assert payload["bootstrap_info"]["bootstrap_host"] == FAKE_BOOTSTRAP_HOST


# --- the prefill leg ------------------------------------------------------------------------

PREFILL_CONFIG = PrefillConfig(bootstrap_host="127.0.0.1", bootstrap_port=18998,
                               orchestration=Orchestration.FRONTEND)


async def test_prefill_uses_the_frontends_room_and_yields_disaggregated_params_first():
    gate = asyncio.Event()
    engine = FakeEngine([DONE], gate=gate)
    stream = PrefillHandler(engine, PREFILL_CONFIG).generate(dict(FLAT), FakeContext())
    first = await asyncio.wait_for(anext(stream), 5)
    assert len(engine.calls) == 1, "engine must be started before the bootstrap yield"
    expected = {k: BOOT[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
    assert first == {"token_ids": [], "text": None, "finish_reason": None,
                     "disaggregated_params": expected}
    call = engine.calls[0]
    assert {k: call[k] for k in expected} == expected
    assert call["input_ids"] == [1, 2, 3, 4]
    assert call["sampling_params"]["max_new_tokens"] == 1 and call["sampling_params"].get("n", 1) == 1
    gate.set()
    rest = [item async for item in stream]
    assert rest == [{"token_ids": [],
                     "engine_data": {"kv_cache_hit": {"prompt_tokens": 4, "reused_tokens": 2}}}]


async def test_prefill_without_bootstrap_info_draws_its_own_room():
    """The frontend's completed path: it takes the room from prefill's first item."""
    engine = FakeEngine([DONE])
    flat = {k: v for k, v in FLAT.items() if k != "bootstrap_info"}
    out = await collect(PrefillHandler(engine, PREFILL_CONFIG).generate(flat, FakeContext()))
    params = out[0]["disaggregated_params"]
    assert params["bootstrap_port"] == 18998 and 1 <= params["bootstrap_room"] < 2**63
    assert engine.calls[0]["bootstrap_room"] == params["bootstrap_room"]


async def test_prefill_leg_keeps_n_and_asks_one_token_per_choice():
    engine = FakeEngine([DONE])
    flat = {**FLAT, "sampling_options": {"temperature": 0.7, "n": 3}}
    await collect(PrefillHandler(engine, PREFILL_CONFIG).generate(flat, FakeContext()))
    params = engine.calls[0]["sampling_params"]
    assert (params["n"], params["max_new_tokens"]) == (3, 1)
    assert engine.calls[0]["bootstrap_room"] == BOOT["bootstrap_room"]


@pytest.mark.parametrize("change, words", [
    ({"bootstrap_info": {**BOOT, "bootstrap_host": "0.0.0.0"}}, "bootstrap_info"),
    ({"token_ids": "abc"}, "token_ids"),
])
async def test_prefill_refuses_what_decode_refuses_before_touching_the_engine(change, words):
    engine = FakeEngine([DONE])
    with pytest.raises(RequestError, match=words):
        await collect(PrefillHandler(engine, PREFILL_CONFIG).generate({**FLAT, **change},
                                                                      FakeContext()))
    assert engine.calls == []


# --- the decode leg -------------------------------------------------------------------------

FRONTEND_DECODE = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                               orchestration=Orchestration.FRONTEND)


async def test_decode_joins_the_frontends_room():
    engine = FakeEngine([chunk([10], completion=1),
                         chunk([11], {"type": "length", "length": 2}, prompt=3, completion=2)])
    handler = DecodeHandler(engine, FRONTEND_DECODE)  # no prefill client needed
    out = await collect(handler.generate({**DECODE_REQ, "bootstrap_info": BOOT}, FakeContext()))
    assert [d["token_ids"] for d in out] == [[10], [11]]
    call = engine.calls[0]
    assert (call["bootstrap_host"], call["bootstrap_port"], call["bootstrap_room"]) == (
        BOOT["bootstrap_host"], BOOT["bootstrap_port"], BOOT["bootstrap_room"])


@pytest.mark.parametrize("boot, words", [
    (None, "bootstrap_info is required"),
    ({**BOOT, "bootstrap_port": 0}, "bootstrap_info"),
    ({"bootstrap_host": "10.0.0.7"}, "bootstrap_info"),
])
async def test_decode_without_a_usable_bootstrap_info_is_a_request_error(boot, words):
    engine = FakeEngine([])
    request = dict(DECODE_REQ) if boot is None else {**DECODE_REQ, "bootstrap_info": boot}
    with pytest.raises(RequestError, match=words):
        await collect(DecodeHandler(engine, FRONTEND_DECODE).generate(request, FakeContext()))
    assert engine.calls == []


async def test_decode_reads_bootstrap_info_once_and_a_bad_body_is_answered_first(monkeypatch):
    """The room is parsed once, as the request arrives (its claim comes first); a missing
    bootstrap_info is answered only after the body's own checks."""
    from handlers.disagg import frontend_disagg

    reads = []
    parse_once = frontend_disagg.request_bootstrap
    monkeypatch.setattr(frontend_disagg, "request_bootstrap",
                        lambda *a, **kw: reads.append(1) or parse_once(*a, **kw))
    engine = FakeEngine([chunk([11], {"type": "length", "length": 1}, prompt=3, completion=1)])
    await collect(DecodeHandler(engine, FRONTEND_DECODE).generate(
        {**DECODE_REQ, "bootstrap_info": BOOT}, FakeContext()))
    assert len(reads) == 1
    with pytest.raises(RequestError, match="token_ids"):
        await collect(DecodeHandler(engine, FRONTEND_DECODE).generate(
            {**DECODE_REQ, "token_ids": "abc"}, FakeContext()))


@pytest.mark.parametrize("mode, style, expected", [
    ("null", "frontend", "NONE"), ("null", "decode", "NONE"),
    ("prefill", "frontend", "FRONTEND"), ("decode", "frontend", "FRONTEND"),
    ("prefill", "decode", "DECODE"), ("decode", "decode", "DECODE"),
])
def test_the_role_decides_the_orchestration_both_handlers_get(mode, style, expected):
    cfg = parse_args([*MODEL, "--disaggregation-mode", mode, "--skip-tokenizer-init",
                      "--disagg-orchestrator", style])
    assert cfg.role.orchestration is Orchestration[expected]


@pytest.mark.parametrize("mode", ["prefill", "decode"])
async def test_cancel_anytime_is_advertised_only_by_an_engine_that_orders_its_aborts(
        monkeypatch, mode):
    ordered = await _registered(monkeypatch, mode, "frontend")
    assert ordered["runtime_config"].runtime_data.get(register.CANCEL_ANYTIME) in (True, "true")
    unordered = await _registered(monkeypatch, mode, "frontend",
                                  dataclasses.replace(LIMITS, cancel_anytime=False))
    assert register.CANCEL_ANYTIME not in unordered["runtime_config"].runtime_data
