"""The model runner's packed forward against stock HF attention: logits and pool K/V agree
whether a prompt is forwarded whole, in chunks, or packed with other requests' tokens."""

import pytest
import torch

from components.engine.core.batch import Batch, PrefillChunk
from components.engine.kv.pool import KVPool
from components.engine.model.facts import read_model_shape
from components.engine.core.runner import ModelRunner
from components.engine.output.sampling_params import SamplingParams
from components.engine.core.sequence import Sequence
from tests.support.engine_helpers import load_reference, random_prompt

ATOL = 1e-4


@pytest.fixture(scope="module")
def runner(small_model_path):
    shape = read_model_shape(small_model_path)
    pool = KVPool(shape.num_layers, shape.num_kv_heads, shape.head_dim, num_pages=64,
                  page_size=16, dtype=torch.float32)
    return ModelRunner(small_model_path, "float32", pool)


@pytest.fixture(scope="module")
def reference(small_model_path):
    return load_reference(small_model_path)


def make_seq(runner, ids, first_page):
    seq = Sequence(rid=f"r{first_page}", params=SamplingParams(), sink=lambda c, f: None,
                   input_ids=ids)
    seq.attach_pages(runner.pool.allocate(len(ids) + 8), runner.pool.page_size)
    return seq


def hf_last_logits(reference, ids):
    with torch.inference_mode():
        return reference(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("cuts", [[], [1], [37, 38, 90]])
def test_chunked_prefill_matches_stock_attention(runner, reference, cuts):
    ids = random_prompt(120, runner.vocab_size, seed=len(cuts))
    seq = make_seq(runner, ids, 0)
    bounds = [0, *cuts, len(ids)]
    for a, b in zip(bounds, bounds[1:]):
        logits = runner.forward(Batch(prefill=[PrefillChunk(seq, a, b)]))
    assert torch.allclose(logits[0], hf_last_logits(reference, ids), atol=ATOL)
    # Decode one token from the chunked KV: equals HF on the extended prompt.
    seq.output_ids.append(int(logits[0].argmax()))
    step = runner.forward(Batch(decode=[seq]))
    assert torch.allclose(step[0], hf_last_logits(reference, ids + seq.output_ids), atol=ATOL)
    runner.pool.free(seq.pages)


def test_packed_prompts_and_decode_rows_in_one_forward(runner, reference):
    a_ids, b_ids, c_ids = (random_prompt(n, runner.vocab_size, seed=n) for n in (50, 9, 70))
    a, b, c = (make_seq(runner, ids, i) for i, ids in enumerate((a_ids, b_ids, c_ids)))
    first = runner.forward(Batch(prefill=[PrefillChunk(a, 0, 50), PrefillChunk(c, 0, 30)]))
    assert first.shape[0] == 1  # c's chunk does not complete its prompt: no logits row
    a.output_ids.append(int(first[0].argmax()))
    mixed = runner.forward(Batch(prefill=[PrefillChunk(b, 0, 9), PrefillChunk(c, 30, 70)],
                                 decode=[a]))
    want = [hf_last_logits(reference, ids) for ids in (b_ids, c_ids, a_ids + a.output_ids)]
    for got, exp in zip(mixed, want):
        assert torch.allclose(got, exp, atol=ATOL)
    for seq in (a, b, c):
        runner.pool.free(seq.pages)
