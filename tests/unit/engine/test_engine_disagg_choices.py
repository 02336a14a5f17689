"""``n > 1`` on disaggregated CPU engines (prefill in a child process, decode here, real NIXL):
the prompt is prefilled and its KV written once, in one room, with every choice's first token;
the decode forks it into the choices, which equal aggregated ``n > 1`` token for token (greedy,
seeded, logprobs); aborts and refusals free every page on both sides."""

import asyncio

import pytest

from tests.support.engine_helpers import boot, random_prompt
from tests.unit.engine.disagg_engines import assert_pools_empty, pair

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
SEEDED = {"temperature": 0.8, "top_k": 50, "max_new_tokens": 12, "sampling_seed": 42,
          "ignore_eos": True}


def by_choice(chunks, key="output_ids"):
    out: dict[int, list] = {}
    for c in chunks:
        out.setdefault(c["index"], []).extend(c[key] if key == "output_ids"
                                              else c["meta_info"][key])
    return [out[i] for i in sorted(out)]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_one_prefill_one_room_n_choices_equal_aggregated(prefill, decode, agg, params):
    ids = random_prompt(70, agg.vocab_size, seed=21)
    want = await agg.async_generate(input_ids=ids, sampling_params={**params, "n": 3})
    p, chunks = await pair(prefill, decode, ids, {**params, "n": 3}, stream=True)
    # The prefill ran the prompt once, as one row: one chunk, one token, no choice index.
    assert "index" not in p and len(p["output_ids"]) == 1
    assert p["meta_info"]["prompt_tokens"] == len(ids)
    assert by_choice(chunks) == [w["output_ids"] for w in want]
    if params is SEEDED:
        assert len({tuple(c) for c in by_choice(chunks)}) > 1  # each choice samples on its own
    await assert_pools_empty(prefill, decode)


async def test_every_choices_first_token_logprobs_cross_with_the_kv(prefill, decode, agg):
    lp = {"return_logprob": True, "top_logprobs_num": 20}
    params = {**SEEDED, "n": 8, "max_new_tokens": 4}  # 8 x 20 alternatives in one notification
    ids = random_prompt(45, agg.vocab_size, seed=11)
    want = await agg.async_generate(input_ids=ids, sampling_params=params, **lp)
    _, chunks = await pair(prefill, decode, ids, params, stream=True, **lp)
    for key in ("output_token_logprobs", "output_top_logprobs"):
        assert by_choice(chunks, key) == [w["meta_info"][key] for w in want], key


async def test_a_prefill_asked_for_one_choice_fails_the_decodes_n3(prefill, decode):
    """Both legs must carry n: a prefill run with n=1 sends no further first tokens, and the
    decode fails the request rather than invent them."""
    ids = random_prompt(30, decode.vocab_size, seed=4)
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=GREEDY, **b))
    d = await decode.async_generate(input_ids=ids, sampling_params={**GREEDY, "n": 3}, **b)
    await asyncio.wait_for(p_task, 30)
    reasons = [c["meta_info"]["finish_reason"] for c in d]
    assert all(r["type"] == "abort" for r in reasons), reasons
    assert "first tokens for 1 choice(s), the request has n=3" in reasons[0]["message"]
    await assert_pools_empty(prefill, decode)


async def test_aborting_the_decodes_n3_mid_stream_frees_both_pools(prefill, decode):
    ids = random_prompt(40, decode.vocab_size, seed=2)
    params = {**GREEDY, "n": 3, "max_new_tokens": 1500}
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=params, **b))
    stream = await decode.async_generate(input_ids=ids, sampling_params=params, stream=True,
                                         rid="n3-abort", **b)
    seen: set[int] = set()
    async for chunk in stream:
        seen.add(chunk["index"])
        if len(seen) == 3:
            break
    decode.tokenizer_manager.abort_request("n3-abort")  # the caller's rid names every choice
    await stream.aclose()
    await asyncio.wait_for(p_task, 30)
    await assert_pools_empty(prefill, decode)
