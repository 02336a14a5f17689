"""CPU engine, n > 1 (`components/engine/core/forks.py`): the prompt is prefilled once and forked into
the choices; each samples with its own seed; chunks carry `index`; closing the stream or aborting
the caller's rid ends every choice and frees its KV."""

import asyncio

import pytest

from components.engine.process.engine import CpuEngine
from tests.support.engine_helpers import drain, random_prompt, wait_until

SEEDED = {"temperature": 0.8, "max_new_tokens": 10, "ignore_eos": True, "sampling_seed": 7}


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    # Chunked prefill and no prefix cache: the choices' prompt K/V can only come from the fork.
    eng = CpuEngine(model_path=tiny_model_path, context_length=2048, max_total_tokens=8192,
                    chunked_prefill_size=32, disable_radix_cache=True)
    yield eng
    eng.shutdown()


def by_choice(chunks):
    out: dict[int, list[int]] = {}
    for c in chunks:
        out.setdefault(c["index"], []).extend(c["output_ids"])
    return out


async def test_n3_streams_three_choices_each_as_its_own_seeded_request(engine):
    ids = random_prompt(70, engine.vocab_size, seed=3)
    stream = await engine.async_generate(input_ids=ids, sampling_params={**SEEDED, "n": 3},
                                         stream=True, rid="n3")
    chunks = await asyncio.wait_for(drain(stream), 60)
    got = by_choice(chunks)
    assert sorted(got) == [0, 1, 2]
    finals = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert sorted(c["index"] for c in finals) == [0, 1, 2]
    assert all(c["meta_info"]["completion_tokens"] == 10 for c in finals)
    assert all(c["meta_info"]["prompt_tokens"] == len(ids) for c in finals)
    assert len({c["meta_info"]["id"] for c in chunks} | {"n3"}) == 4  # fresh rid per choice
    assert len({tuple(v) for v in got.values()}) == 3, got
    # Choice i is the request with seed 7 + i: the forked prompt K/V equals a prefilled one.
    for i in range(3):
        one = await engine.async_generate(
            input_ids=ids, sampling_params={**SEEDED, "sampling_seed": 7 + i})
        assert one["output_ids"] == got[i], i
    assert engine.kv_pages_in_use() == 0


async def test_same_seed_same_choices_and_whole_output_is_a_list(engine):
    ids = random_prompt(20, engine.vocab_size, seed=4)
    params = {**SEEDED, "n": 2}
    first = await engine.async_generate(input_ids=ids, sampling_params=params)
    again = await engine.async_generate(input_ids=ids, sampling_params=params)
    assert isinstance(first, list) and len(first) == 2
    assert "index" not in first[0]
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in again]


async def test_choices_finish_independently(engine):
    """A stop token ends each choice where that choice sampled it; the others run on."""
    ids = random_prompt(20, engine.vocab_size, seed=5)
    params = {**SEEDED, "n": 3, "ignore_eos": False}
    first = await engine.async_generate(input_ids=ids, sampling_params=params)
    free = [o["output_ids"] for o in first]
    stop = free[1][2]
    cut = [o[:o.index(stop) + 1] if stop in o else o for o in free]
    outs = await engine.async_generate(input_ids=ids,
                                       sampling_params={**params, "stop_token_ids": [stop]})
    assert [o["output_ids"] for o in outs] == cut
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == [
        "stop" if stop in o else f["meta_info"]["finish_reason"]["type"]
        for o, f in zip(free, first)]
    assert engine.kv_pages_in_use() == 0


@pytest.mark.parametrize("how", ["close", "abort_rid"])
async def test_cancel_mid_stream_ends_every_choice_and_frees_kv(engine, how):
    ids = random_prompt(40, engine.vocab_size, seed=6)
    params = {**SEEDED, "n": 3, "max_new_tokens": 1500}
    stream = await engine.async_generate(input_ids=ids, sampling_params=params, stream=True,
                                         rid=f"cancel-{how}")
    seen, ends, cancelled = set(), [], False
    async for chunk in stream:
        seen.add(chunk["index"])
        if chunk["meta_info"]["finish_reason"] is not None:
            ends.append(chunk["meta_info"]["finish_reason"]["type"])
        elif len(seen) == 3 and not cancelled:
            cancelled = True
            assert engine.kv_pages_in_use() > 0
            if how == "close":
                break
            engine.tokenizer_manager.abort_request(f"cancel-{how}")
    await stream.aclose()
    if how == "abort_rid":
        assert ends == ["abort"] * 3
    await wait_until(lambda: engine.kv_pages_in_use() == 0, what="every choice's pages freed")


async def test_a_group_that_cannot_fit_the_pool_is_refused(engine):
    params = {**SEEDED, "n": 8, "max_new_tokens": 1500}
    with pytest.raises(ValueError, match=r"8 choices of 1520"):
        await engine.async_generate(input_ids=random_prompt(20, engine.vocab_size, 7),
                                    sampling_params=params)
    assert engine.kv_pages_in_use() == 0


async def test_more_choices_than_max_running_requests_run_alone(tiny_model_path):
    """A group larger than max_running_requests is admitted when nothing else runs, instead
    of waiting forever; the request queued behind it runs after it."""
    eng = CpuEngine(model_path=tiny_model_path, context_length=512, max_total_tokens=4096,
                    max_running_requests=2)
    try:
        ids = random_prompt(10, eng.vocab_size, seed=8)
        big = eng.async_generate(input_ids=ids, sampling_params={**SEEDED, "n": 5})
        small = eng.async_generate(input_ids=ids, sampling_params={**SEEDED, "n": 2})
        outs = await asyncio.wait_for(asyncio.gather(big, small), 60)
        assert [len(o) for o in outs] == [5, 2]
        assert all(len(c["output_ids"]) == 10 for o in outs for c in o)
        assert eng.kv_pages_in_use() == 0
    finally:
        eng.shutdown()
