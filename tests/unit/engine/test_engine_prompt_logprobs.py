"""CPU engine prompt logprobs (SGLang's ``logprob_start_len``): ``input_token_logprobs`` and
``input_top_logprobs`` on the final chunk, checked against transformers' own forward, across
chunked prefill, from a later start, past a cached prefix, and shared by ``n > 1`` choices."""

import pytest
import torch

from components.engine.process.engine import CpuEngine
from components.engine.config import DisaggregationMode
from tests.e2e.transformers_ref import _model
from tests.support.engine_helpers import drain, random_prompt

pytestmark = pytest.mark.timeout(120)

TOL = 1e-4
TOP = 3
GREEDY = {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    # 16-token chunks: a 40-token prompt's logprobs come from three forwards.
    eng = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True,
                    chunked_prefill_size=16)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    model = _model(tiny_model_path)

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return logprobs


def _check(meta, ids, start, ref, top=TOP):
    entries = meta["input_token_logprobs"]
    assert [t for _, t, _ in entries] == ids[start:]
    assert entries[0][0] is None  # nothing precedes the first position asked for
    for pos, (lp, tok, text) in enumerate(entries[1:], start):
        assert text is None and abs(lp - ref[pos, tok].item()) < TOL
    tops = meta.get("input_top_logprobs")
    if top == 0:
        assert not tops
        return
    assert tops[0] is None and len(tops) == len(entries)
    for pos, alts in enumerate(tops[1:], start):
        want = torch.topk(ref[pos], top)
        assert [t for _, t, _ in alts] == want.indices.tolist()


@pytest.mark.parametrize("start, top", [(0, TOP), (0, 0), (25, TOP)])
async def test_prompt_logprobs_match_transformers(engine, reference, start, top):
    ids = random_prompt(40, engine.vocab_size, seed=11)
    out = await engine.async_generate(input_ids=ids, sampling_params=GREEDY, stream=True,
                                      return_logprob=True, top_logprobs_num=top,
                                      logprob_start_len=start)
    chunks = await drain(out)
    assert all("input_token_logprobs" not in c["meta_info"] for c in chunks[:-1])
    _check(chunks[-1]["meta_info"], ids, start, reference(ids), top)
    assert engine.kv_pages_in_use() == 0


async def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(engine, reference):
    ids = random_prompt(48, engine.vocab_size, seed=12)
    await engine.async_generate(input_ids=ids, sampling_params=GREEDY)  # caches its pages
    again = await engine.async_generate(input_ids=ids, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] > 0
    out = await engine.async_generate(input_ids=ids, sampling_params=GREEDY,
                                      return_logprob=True, top_logprobs_num=TOP,
                                      logprob_start_len=0)
    assert out["meta_info"]["cached_tokens"] == 0
    _check(out["meta_info"], ids, 0, reference(ids))


async def test_every_choice_carries_the_prompt_logprobs(engine, reference):
    ids = random_prompt(20, engine.vocab_size, seed=13)
    outs = await engine.async_generate(
        input_ids=ids, sampling_params={**GREEDY, "n": 2, "temperature": 0.8},
        return_logprob=True, top_logprobs_num=TOP, logprob_start_len=0)
    ref = reference(ids)
    for out in outs:
        _check(out["meta_info"], ids, 0, ref)


async def test_a_decode_engine_refuses_prompt_logprobs(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True,
                    disaggregation_mode=DisaggregationMode.DECODE)
    try:
        with pytest.raises(ValueError, match="decode-mode engine"):
            await eng.async_generate(input_ids=[1, 2, 3], sampling_params=GREEDY,
                                     return_logprob=True, logprob_start_len=0,
                                     bootstrap_host="2.2.2.2", bootstrap_port=1, bootstrap_room=1)
    finally:
        eng.shutdown()
