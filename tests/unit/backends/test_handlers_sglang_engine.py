"""The handlers against a fake that behaves like SGLang where the CPU engine differs: a bad
parameter raises ValueError on the stream's first read, and n > 1 runs sub-requests under fresh
rids that only closing the stream aborts."""

import pytest

from handlers import DecodeConfig, DecodeHandler, PrefillConfig, PrefillHandler
from handlers.disagg.orchestration import Orchestration
from handlers.core.errors import RequestError
from tests.support.handler_fakes import FakeContext, collect
from tests.support.sglang_fake import SGLangLikeEngine

pytestmark = pytest.mark.timeout(10)

AGG = DecodeConfig(served_model_name="tiny", context_length=4096, vocab_size=100,
                   orchestration=Orchestration.NONE)
REQUEST = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 500},
           "sampling_options": {"temperature": 0.7}, "eos_token_ids": [2]}
SGLANG_MESSAGE = "top_k must be -1 (disable) or at least 1, got 0."


async def test_decode_turns_sglangs_first_read_value_error_into_a_request_error():
    engine = SGLangLikeEngine(reject=SGLANG_MESSAGE)
    with pytest.raises(RequestError) as err:
        await collect(DecodeHandler(engine, AGG).generate(REQUEST, FakeContext()))
    assert str(err.value) == SGLANG_MESSAGE  # the client sees SGLang's own words


async def test_prefill_refused_on_first_read_sends_no_bootstrap_info():
    engine = SGLangLikeEngine(reject=SGLANG_MESSAGE)
    handler = PrefillHandler(engine, PrefillConfig(bootstrap_host="127.0.0.1",
                                                   bootstrap_port=18998,
                                                   orchestration=Orchestration.DECODE))
    request = {"request": {"token_ids": [1, 2, 3]}, "sampling_params": {"top_k": 0}}
    items = []
    with pytest.raises(RequestError, match="top_k must be"):
        async for item in handler.generate(request, FakeContext()):
            items.append(item)
    assert items == []  # no decode is sent to a room that will never be served


@pytest.mark.parametrize("n", [1, 3])
async def test_stop_mid_stream_aborts_every_sub_request(n):
    engine = SGLangLikeEngine()
    request = {**REQUEST, "sampling_options": {"temperature": 0.7, "n": n}}
    context = FakeContext()
    seen = 0
    async for _ in DecodeHandler(engine, AGG).generate(request, context):
        seen += 1
        if seen == 2 * n:
            context.stop()
    # Checked before yielding to the loop: nothing is left for a garbage-collected stream's
    # finalizer to clean up later.
    assert engine.live == {}
    assert len(engine.dispatched) == n and sorted(engine.aborted) == sorted(engine.dispatched)


async def test_finished_n_above_one_leaves_nothing_behind():
    engine = SGLangLikeEngine()
    request = {**REQUEST, "stop_conditions": {"max_tokens": 3},
               "sampling_options": {"temperature": 0.7, "n": 2}}
    out = await collect(DecodeHandler(engine, AGG).generate(request, FakeContext()))
    assert sorted(d.get("index", 0) for d in out if d.get("finish_reason")) == [0, 1]
    assert engine.live == {} and engine.aborted == []
