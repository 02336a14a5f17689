"""Aggregated CPU engine: token identity with HF generate, chunk shapes, finish conditions."""

import asyncio

import pytest
from transformers import AutoTokenizer

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import (
    assert_chunk_shape, drain, load_reference, random_prompt, reference_greedy,
)

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, max_total_tokens=32768)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    return load_reference(tiny_model_path)


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def prompts(tok, vocab):
    chat = tok.apply_chat_template(
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name three rivers in Europe."}],
        add_generation_prompt=True, tokenize=True)["input_ids"]
    return {
        "plain": tok("The quick brown fox jumps over the lazy dog")["input_ids"],
        "chat": chat,
        "long": random_prompt(600, vocab, seed=1),
    }


async def test_greedy_matches_generate_single(engine, reference, tok):
    for name, ids in prompts(tok, engine.vocab_size).items():
        want = reference_greedy(reference, ids, 40, engine.eos_token_ids)
        out = await engine.async_generate(input_ids=ids,
                                          sampling_params={**GREEDY, "max_new_tokens": 40})
        assert out["output_ids"] == want, name
        assert out["meta_info"]["prompt_tokens"] == len(ids)
    assert engine.kv_pages_in_use() == 0


async def test_greedy_matches_generate_concurrent(engine, reference):
    # 10 requests of different lengths and budgets, half arriving while the others decode.
    reqs = [(random_prompt(20 + 57 * i, engine.vocab_size, seed=10 + i), 12 + 3 * i)
            for i in range(10)]
    wants = [reference_greedy(reference, ids, n, engine.eos_token_ids) for ids, n in reqs]

    async def one(i, ids, n):
        if i % 2:
            await asyncio.sleep(0.005 * i)  # staggered arrival, so rows join a running batch
        return await engine.async_generate(input_ids=ids,
                                           sampling_params={**GREEDY, "max_new_tokens": n})

    outs = await asyncio.gather(*(one(i, ids, n) for i, (ids, n) in enumerate(reqs)))
    for i, (out, want) in enumerate(zip(outs, wants)):
        assert out["output_ids"] == want, f"request {i}"
    assert engine.kv_pages_in_use() == 0


async def test_text_prompt_equals_its_token_ids(engine, tok):
    text = "Rivers of Europe"
    a = await engine.async_generate(prompt=text, sampling_params={**GREEDY, "max_new_tokens": 8})
    b = await engine.async_generate(input_ids=tok(text)["input_ids"],
                                    sampling_params={**GREEDY, "max_new_tokens": 8})
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]


async def test_stream_chunks_are_incremental_deltas(engine, tok):
    params = {**GREEDY, "max_new_tokens": 24}
    chunks = await drain(await engine.async_generate(prompt="Hello there", sampling_params=params,
                                                     stream=True, rid="stream-1"))
    final = await engine.async_generate(prompt="Hello there", sampling_params=params)
    sent = 0
    for i, chunk in enumerate(chunks):
        assert_chunk_shape(chunk, with_text=True)
        assert chunk["meta_info"]["id"] == "stream-1"
        # stream_interval 1: one new token per chunk, unless several queued up while this
        # consumer was busy (then they arrive as one, as SGLang coalesces them)
        assert len(chunk["output_ids"]) >= 1
        sent += len(chunk["output_ids"])
        assert chunk["meta_info"]["completion_tokens"] == sent
        assert (chunk["meta_info"]["finish_reason"] is None) == (i < len(chunks) - 1)
    ids = [t for c in chunks for t in c["output_ids"]]
    assert ids == final["output_ids"] and len(ids) == 24
    assert "".join(c["text"] for c in chunks) == final["text"] == tok.decode(ids)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 24}
    assert final["meta_info"]["cached_tokens"] == 0 and final["meta_info"]["e2e_latency"] > 0


async def test_stream_interval_batches_tokens(engine):
    params = {**GREEDY, "max_new_tokens": 10, "stream_interval": 4}
    chunks = await drain(await engine.async_generate(input_ids=[5, 6, 7], sampling_params=params,
                                                     stream=True))
    # Chunks end only on the interval's grid (the first token at once, then every 4, then the
    # rest); a consumer that falls behind gets adjacent chunks joined, never split.
    ends = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert ends[-1] == 10 and set(ends) <= {1, 5, 9, 10}
    assert [len(c["output_ids"]) for c in chunks] == [b - a for a, b in zip([0] + ends, ends)]


async def test_stop_string_is_not_emitted(engine):
    base = await engine.async_generate(prompt="Once upon", sampling_params={**GREEDY,
                                                                            "max_new_tokens": 30})
    text = base["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = text.find(stop)
    assert cut > 0
    for stream in (False, True):
        out = await engine.async_generate(
            prompt="Once upon", sampling_params={**GREEDY, "max_new_tokens": 30, "stop": [stop]},
            stream=stream)
        chunks = await drain(out) if stream else [out]
        got = "".join(c["text"] for c in chunks)
        assert got == text[:cut]
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    kept = await engine.async_generate(
        prompt="Once upon",
        sampling_params={**GREEDY, "max_new_tokens": 30, "stop": stop, "no_stop_trim": True})
    assert kept["text"] == text[:cut + len(stop)]


async def test_stop_token_ids(engine, tok):
    base = await engine.async_generate(input_ids=[9, 10, 11],
                                       sampling_params={**GREEDY, "max_new_tokens": 20})
    target = base["output_ids"][6]
    first = base["output_ids"].index(target)
    out = await engine.async_generate(
        input_ids=[9, 10, 11],
        sampling_params={**GREEDY, "max_new_tokens": 20, "stop_token_ids": [target]})
    assert out["output_ids"] == base["output_ids"][:first + 1]  # the stop token is delivered
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert out["text"] == tok.decode(base["output_ids"][:first])  # but not its text


async def test_eos_ignore_eos_and_min_new_tokens(engine):
    eos = 2
    assert eos in engine.eos_token_ids
    force_eos = {"logit_bias": {str(eos): 100.0}, **GREEDY, "max_new_tokens": 6}
    out = await engine.async_generate(input_ids=[5, 6], sampling_params=force_eos)
    assert out["output_ids"] == [eos] and out["text"] == ""
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    out = await engine.async_generate(input_ids=[5, 6],
                                      sampling_params={**force_eos, "ignore_eos": True})
    assert out["output_ids"] == [eos] * 6
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    out = await engine.async_generate(input_ids=[5, 6],
                                      sampling_params={**force_eos, "min_new_tokens": 3})
    assert len(out["output_ids"]) == 4 and out["output_ids"][-1] == eos
    assert eos not in out["output_ids"][:3]


async def test_max_new_tokens_zero_and_the_context_limit(engine, tiny_model_path):
    out = await engine.async_generate(input_ids=[5, 6], sampling_params={"max_new_tokens": 0})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    small = CpuEngine(model_path=tiny_model_path, context_length=32, max_total_tokens=256)
    try:
        ids = list(range(3, 28))
        # Unset: up to the context (25 prompt + 7 = 32); explicit and too many: refused.
        out = await small.async_generate(
            input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": None, "ignore_eos": True})
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
        with pytest.raises(ValueError, match="You requested a total of 125 tokens"):
            await small.async_generate(input_ids=ids,
                                       sampling_params={**GREEDY, "max_new_tokens": 100})
    finally:
        small.shutdown()


async def test_seeded_sampling_is_reproducible(engine):
    params = {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 24, "sampling_seed": 1234}
    a = await engine.async_generate(input_ids=[7, 8, 9], sampling_params=params)
    b = await engine.async_generate(input_ids=[7, 8, 9], sampling_params=params)
    c = await engine.async_generate(input_ids=[7, 8, 9],
                                    sampling_params={**params, "sampling_seed": 99})
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                     {"repetition_penalty": 2.0}])
async def test_penalties_change_greedy_output(engine, penalty):
    params = {**GREEDY, "max_new_tokens": 40, "ignore_eos": True}
    plain = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=params)
    assert len(set(plain["output_ids"])) < 40  # it repeats itself, so penalties have a target
    pen = await engine.async_generate(input_ids=[5, 6, 7], sampling_params={**params, **penalty})
    assert pen["output_ids"] != plain["output_ids"]
    if "frequency_penalty" in penalty or "presence_penalty" in penalty:
        assert len(set(pen["output_ids"])) > len(set(plain["output_ids"]))


@pytest.mark.parametrize("mixed", [False, True])
async def test_chunked_prefill_is_token_identical(tiny_model_path, reference, mixed):
    """SGLang's chunked prefill: long prompts forwarded 64 tokens at a time, between (or with,
    ``enable_mixed_chunk``) decode steps of the running rows, give exactly the tokens of an
    unchunked prefill."""
    eng = CpuEngine(model_path=tiny_model_path, chunked_prefill_size=64, max_prefill_tokens=96,
                    enable_mixed_chunk=mixed)
    try:
        reqs = [(random_prompt(n, eng.vocab_size, seed=50 + n), 16) for n in (30, 200, 600)]
        wants = [reference_greedy(reference, ids, n, eng.eos_token_ids) for ids, n in reqs]
        outs = await asyncio.gather(*(
            eng.async_generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": n})
            for ids, n in reqs))
        assert [o["output_ids"] for o in outs] == wants
        assert eng.kv_pages_in_use() == 0
    finally:
        eng.shutdown()


async def test_a_routed_dp_rank_is_checked_as_sglang_checks_it(engine):
    """One data-parallel rank: the router's rank 0 runs, any other is SGLang's refusal."""
    out = await engine.async_generate(input_ids=[5, 6, 7], routed_dp_rank=0,
                                      disagg_prefill_dp_rank=0,
                                      sampling_params={**GREEDY, "max_new_tokens": 2})
    assert len(out["output_ids"]) == 2
    for kwargs in ({"routed_dp_rank": 1}, {"data_parallel_rank": 2}):
        with pytest.raises(ValueError, match=r"routed_dp_rank=\d out of range \[0, 1\)"):
            await engine.async_generate(input_ids=[5, 6, 7], sampling_params=GREEDY, **kwargs)
    assert engine.kv_pages_in_use() == 0
