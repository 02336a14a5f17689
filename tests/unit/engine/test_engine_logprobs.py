"""CPU engine logprobs: SGLang's semantics (components/engine/output/logprobs.py) checked against
transformers' own logits, streamed and not, per row, and the Engine API's refusals."""

import pytest
import torch

from components.engine.process.engine import CpuEngine
from tests.e2e.transformers_ref import _model, greedy_logprobs
from tests.support.engine_helpers import drain, random_prompt

TOL = 1e-4
PROMPT_SEED = 7


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True)
    yield eng
    eng.shutdown()


def _flat(chunks, key):
    return [e for c in chunks for e in c["meta_info"].get(key, [])]


def assert_matches(entries, tops, want_ids, want_lps, want_tops):
    assert [t for _, t, _ in entries] == want_ids
    for (lp, _, text), want in zip(entries, want_lps):
        assert text is None  # the Engine API returns no token text in logprobs
        assert abs(lp - want) < TOL
    for got, want in zip(tops, want_tops):
        assert [t for _, t, _ in got] == [t for _, t in want]
        assert max(abs(a[0] - b[0]) for a, b in zip(got, want)) < TOL


async def test_greedy_logprobs_match_transformers(engine, tiny_model_path):
    ids = random_prompt(40, engine.vocab_size, seed=PROMPT_SEED)
    want_ids, want_lps, want_tops = greedy_logprobs(tiny_model_path, ids, 12, 5)
    params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    out = await engine.async_generate(input_ids=ids, sampling_params=params,
                                      return_logprob=True, top_logprobs_num=5)
    meta = out["meta_info"]
    assert_matches(meta["output_token_logprobs"], meta["output_top_logprobs"],
                   want_ids, want_lps, want_tops)
    chunks = await drain(await engine.async_generate(
        input_ids=ids, sampling_params={**params, "stream_interval": 3}, stream=True,
        return_logprob=True, top_logprobs_num=5))
    for c in chunks:  # each chunk's logprobs align with its own disjoint output_ids
        assert [t for _, t, _ in c["meta_info"]["output_token_logprobs"]] == c["output_ids"]
    # The same values streamed, within fp32 noise: the second request reads the prompt's KV from
    # the prefix cache, and its batch shapes differ, so the sums run in another order.
    streamed = _flat(chunks, "output_token_logprobs")
    assert_matches(streamed, _flat(chunks, "output_top_logprobs"), want_ids,
                   [lp for lp, _, _ in meta["output_token_logprobs"]],
                   [[(lp, t) for lp, t, _ in top] for top in meta["output_top_logprobs"]])
    assert engine.kv_pages_in_use() == 0


async def test_sampled_logprobs_are_after_temperature_before_top_k(engine, tiny_model_path):
    # SGLang: log(softmax(logits / T)) before top-k/top-p filtering.
    ids = random_prompt(30, engine.vocab_size, seed=PROMPT_SEED + 1)
    params = {"temperature": 0.6, "top_k": 3, "sampling_seed": 5, "max_new_tokens": 6,
              "ignore_eos": True}
    out = await engine.async_generate(input_ids=ids, sampling_params=params,
                                      return_logprob=True, top_logprobs_num=4)
    model, seq = _model(tiny_model_path), list(ids)
    for (lp, tok, _), top in zip(out["meta_info"]["output_token_logprobs"],
                                 out["meta_info"]["output_top_logprobs"]):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, -1].float()
        ref = torch.log_softmax(logits / 0.6, dim=-1)
        assert abs(lp - float(ref[tok])) < TOL
        assert len(top) == 4 and abs(top[3][0] - float(torch.topk(ref, 4).values[3])) < TOL
        seq.append(tok)


async def test_only_rows_that_ask_get_logprobs(engine):
    ids = random_prompt(20, engine.vocab_size, seed=3)
    params = {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
    with_lp = await engine.async_generate(input_ids=ids, sampling_params=params,
                                          stream=True, return_logprob=True)
    without = await engine.async_generate(input_ids=ids, sampling_params=params, stream=True)
    a, b = await drain(with_lp), await drain(without)
    assert len(_flat(a, "output_token_logprobs")) == 5
    assert not _flat(a, "output_top_logprobs")  # top_logprobs_num 0: no top lists, as SGLang
    assert all("output_token_logprobs" not in c["meta_info"] for c in b)


@pytest.mark.parametrize("kwargs, match", [
    ({"return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
    ({"return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ({"return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"return_logprob": True, "logprob_start_len": 4}, "higher than the number of input tokens"),
    ({"return_logprob": "yes"}, "return_logprob"),
])
async def test_bad_logprob_arguments_are_refused(engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        await engine.async_generate(input_ids=[1, 2, 3], **kwargs)
    assert engine.kv_pages_in_use() == 0
