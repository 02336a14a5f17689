"""The routing hints reach the engine on every leg that runs it, as Dynamo 1.6.1's SGLang worker
passes them: `priority`, the KV router's `dp_rank` (`routed_dp_rank`) and, on a disaggregated
decode, the prefill's rank (`disagg_prefill_dp_rank`); a malformed one is the client's 400."""

import dataclasses

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.core.errors import RequestError
from handlers.prefill import PrefillConfig, PrefillHandler
from handlers.disagg.orchestration import Orchestration
from handlers.core.routing import DP_RANK_UNSET
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(10)

AGG = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                   orchestration=Orchestration.NONE)
TOKENS = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 1},
          "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2]}
DONE = chunk([9], {"type": "length", "length": 1}, prompt=3, completion=1)
PREFILL = PrefillConfig(bootstrap_host="127.0.0.1", bootstrap_port=18998,
                        orchestration=Orchestration.FRONTEND)
# a decode-orchestrated prefill: the decode's {request, sampling_params}
PREFILL_CALLED = dataclasses.replace(PREFILL, orchestration=Orchestration.DECODE)


async def test_an_aggregated_request_passes_its_priority():
    engine = FakeEngine([DONE])
    await collect(DecodeHandler(engine, AGG).generate(
        {**TOKENS, "routing": {"priority": 5}}, FakeContext()))
    assert engine.calls[0]["priority"] == 5


async def test_without_a_priority_the_engine_gets_none():
    engine = FakeEngine([DONE])
    await collect(DecodeHandler(engine, AGG).generate(
        {**TOKENS, "routing": {"prefill_worker_id": 7}}, FakeContext()))
    assert "priority" not in engine.calls[0]


@pytest.mark.parametrize("config, request_", [
    (PREFILL, {**TOKENS, "routing": {"priority": -3}}),  # the frontend's flat prefill leg
    (PREFILL_CALLED, {"request": {**TOKENS, "routing": {"priority": -3}},
                      "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}),
])
async def test_a_prefill_leg_passes_its_priority(config, request_):
    engine = FakeEngine([DONE])
    await collect(PrefillHandler(engine, config).generate(request_, FakeContext()))
    assert engine.calls[0]["priority"] == -3


async def test_a_priority_that_is_not_an_integer_is_a_request_error():
    engine = FakeEngine([DONE])
    with pytest.raises(RequestError, match="routing.priority must be an integer"):
        await collect(DecodeHandler(engine, AGG).generate(
            {**TOKENS, "routing": {"priority": "high"}}, FakeContext()))
    assert engine.calls == []


async def test_the_routers_dp_ranks_reach_the_engine():
    engine = FakeEngine([DONE])
    routing = {"dp_rank": 1, "prefill_dp_rank": 2}
    await collect(DecodeHandler(engine, AGG).generate({**TOKENS, "routing": routing},
                                                      FakeContext()))
    assert engine.calls[0]["routed_dp_rank"] == 1
    assert "disagg_prefill_dp_rank" not in engine.calls[0]  # aggregated: no prefill
    engine = FakeEngine([DONE])
    await collect(PrefillHandler(engine, PREFILL).generate({**TOKENS, "routing": routing},
                                                           FakeContext()))
    assert engine.calls[0]["routed_dp_rank"] == 1


async def test_the_routers_unset_rank_is_no_rank():
    engine = FakeEngine([DONE])
    await collect(DecodeHandler(engine, AGG).generate(
        {**TOKENS, "routing": {"dp_rank": DP_RANK_UNSET}}, FakeContext()))
    assert "routed_dp_rank" not in engine.calls[0]


async def test_a_decode_orchestrated_prefill_does_not_take_the_decodes_rank():
    engine = FakeEngine([DONE])
    await collect(PrefillHandler(engine, PREFILL_CALLED).generate(
        {"request": {**TOKENS, "routing": {"dp_rank": 3, "priority": 1}},
         "sampling_params": {"max_new_tokens": 1}}, FakeContext()))
    assert "routed_dp_rank" not in engine.calls[0] and engine.calls[0]["priority"] == 1


@pytest.mark.parametrize("routing, needle", [
    ({"dp_rank": -1}, "routing.dp_rank must be >= 0"),
    ({"dp_rank": "0"}, "routing.dp_rank must be an integer"),
])
async def test_a_malformed_rank_is_a_request_error(routing, needle):
    engine = FakeEngine([DONE])
    with pytest.raises(RequestError, match=needle):
        await collect(DecodeHandler(engine, AGG).generate({**TOKENS, "routing": routing},
                                                          FakeContext()))
    assert engine.calls == []


def test_a_disaggregated_decode_takes_the_prefills_rank():
    from handlers.core.routing import routing_kwargs

    assert routing_kwargs({"dp_rank": 0, "prefill_dp_rank": 2}, decode=True) == {
        "routed_dp_rank": 0, "disagg_prefill_dp_rank": 2}
