"""`routing.priority` reaches the engine's `priority` on every leg that runs the engine, as Dynamo
1.6.1's SGLang worker passes it; a non-integer is the client's 400."""

import pytest

from handlers import DecodeConfig, DecodeHandler
from handlers.errors import RequestError
from handlers.prefill import PrefillConfig, PrefillHandler
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(10)

AGG = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100)
TOKENS = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 1},
          "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2]}
DONE = chunk([9], {"type": "length", "length": 1}, prompt=3, completion=1)
PREFILL = PrefillConfig(bootstrap_host="127.0.0.1", bootstrap_port=18998)


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


@pytest.mark.parametrize("request_", [
    {**TOKENS, "routing": {"priority": -3}},  # the frontend's flat prefill leg
    {"request": {**TOKENS, "routing": {"priority": -3}},  # decode-orchestrated
     "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
])
async def test_a_prefill_leg_passes_its_priority(request_):
    engine = FakeEngine([DONE])
    await collect(PrefillHandler(engine, PREFILL).generate(request_, FakeContext()))
    assert engine.calls[0]["priority"] == -3


async def test_a_priority_that_is_not_an_integer_is_a_request_error():
    engine = FakeEngine([DONE])
    with pytest.raises(RequestError, match="routing.priority must be an integer"):
        await collect(DecodeHandler(engine, AGG).generate(
            {**TOKENS, "routing": {"priority": "high"}}, FakeContext()))
    assert engine.calls == []
