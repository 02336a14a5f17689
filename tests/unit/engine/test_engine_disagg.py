"""Disaggregated CPU engines: prefill in a child process, decode in this one, real NIXL between.

They meet only through the prefill's bootstrap server and NIXL. Checked: the same tokens as
aggregated mode, concurrency, and that every failure (abort on either side, a decode that never
comes, a prefill that never sends, a killed prefill) ends within its bound with an abort and
leaves both KV pools empty.
"""

import asyncio
import time

import pytest
from transformers import AutoTokenizer

from components.engine.process.engine import CpuEngine
from harness.child import cpu_seconds
from harness.engine_proc import EngineProcess
from tests.support.engine_helpers import boot, drain, random_prompt, wait_until
from tests.unit.engine.disagg_engines import TIMEOUTS, assert_pools_empty, pair

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SHORT = {"bootstrap_timeout": 2.0, "transfer_timeout": 2.0}
GREEDY = {"temperature": 0.0, "max_new_tokens": 24}
LONG = {"temperature": 0.0, "max_new_tokens": None, "ignore_eos": True}  # up to the context


async def test_disagg_tokens_match_aggregated(prefill, decode, agg, tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    chat = tok.apply_chat_template([{"role": "user", "content": "Tell me about rivers."}],
                                   add_generation_prompt=True, tokenize=True)["input_ids"]
    for ids in (tok("The quick brown fox")["input_ids"], chat,
                random_prompt(600, agg.vocab_size, seed=5)):
        want = await agg.async_generate(input_ids=ids, sampling_params=GREEDY)
        p, chunks = await pair(prefill, decode, ids, GREEDY, stream=True)
        # The prefill's single chunk (SGLang's shape) carries the first token.
        assert p["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert p["meta_info"]["completion_tokens"] == 1 and len(p["output_ids"]) == 1
        assert chunks[0]["output_ids"][0] == p["output_ids"][0]
        got = [t for c in chunks for t in c["output_ids"]]
        assert got == want["output_ids"]
        assert "".join(c["text"] for c in chunks) == want["text"]
        assert chunks[-1]["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    await assert_pools_empty(prefill, decode)


async def test_disagg_concurrent_requests(prefill, decode, agg):
    reqs = [random_prompt(30 + 61 * i, agg.vocab_size, seed=40 + i) for i in range(10)]
    wants = await asyncio.gather(*(agg.async_generate(input_ids=ids, sampling_params=GREEDY)
                                   for ids in reqs))
    results = await asyncio.gather(*(pair(prefill, decode, ids, GREEDY) for ids in reqs))
    for i, ((p, d), want) in enumerate(zip(results, wants)):
        assert d["output_ids"] == want["output_ids"], f"request {i}"
        assert p["output_ids"] == want["output_ids"][:1]
    await assert_pools_empty(prefill, decode)


async def test_disagg_seeded_sampling_matches_aggregated(prefill, decode, agg):
    params = {"temperature": 0.8, "top_k": 50, "max_new_tokens": 16, "sampling_seed": 42}
    ids = random_prompt(40, agg.vocab_size, seed=9)
    want = await agg.async_generate(input_ids=ids, sampling_params=params)
    _, d = await pair(prefill, decode, ids, params)
    assert d["output_ids"] == want["output_ids"]


async def test_the_decode_reports_its_prefills_cache_hit(prefill, decode, agg):
    """As SGLang's decode: the usage of a request whose prefix the prefill had cached counts
    those tokens, though the decode engine keeps no cache."""
    prefix = random_prompt(300, agg.vocab_size, seed=13)
    first_p, first_d = await pair(prefill, decode, prefix + [5], GREEDY)
    again_p, again_d = await pair(prefill, decode, prefix + [6, 7], GREEDY)
    assert first_d["meta_info"]["cached_tokens"] == first_p["meta_info"]["cached_tokens"] == 0
    cached = again_p["meta_info"]["cached_tokens"]
    assert 0 < cached <= len(prefix) and again_d["meta_info"]["cached_tokens"] == cached


async def test_disagg_logprobs_match_aggregated(prefill, decode, agg):
    # The first token's logprobs are computed by the prefill and ride the KV notification.
    lp = {"return_logprob": True, "top_logprobs_num": 20}
    for params in (GREEDY, {"temperature": 0.7, "max_new_tokens": 8, "sampling_seed": 3}):
        ids = random_prompt(45, agg.vocab_size, seed=11)
        want = (await agg.async_generate(input_ids=ids, sampling_params=params, **lp))
        _, chunks = await pair(prefill, decode, ids, params, stream=True, **lp)
        for key in ("output_token_logprobs", "output_top_logprobs"):
            got = [e for c in chunks for e in c["meta_info"][key]]
            assert got == want["meta_info"][key], key
    # A prefill that was not asked for them cannot give decode the first token's.
    ids = random_prompt(20, agg.vocab_size, seed=12)
    b = boot(prefill)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=GREEDY, **b))
    d = await decode.async_generate(input_ids=ids, sampling_params=GREEDY, **b, **lp)
    await asyncio.wait_for(p_task, 30)
    assert "no logprobs" in d["meta_info"]["finish_reason"]["message"]
    await assert_pools_empty(prefill, decode)


async def test_decode_abort_while_waiting_for_kv(prefill, decode):
    ids = random_prompt(50, decode.vocab_size, seed=1)
    await pair(prefill, decode, ids, GREEDY)  # the side channel is connected from here on
    b = boot(prefill)
    d_stream = await decode.async_generate(input_ids=ids, sampling_params=GREEDY, stream=True,
                                           rid="d-wait", **b)
    reading = asyncio.create_task(drain(d_stream))  # a stream is sent on its first read
    await wait_until(lambda: decode.kv_pages_in_use() > 0, what="decode registered the room")
    decode.tokenizer_manager.abort_request("d-wait")
    chunks = await asyncio.wait_for(reading, 5)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    # The decode frees the pages once the prefill acknowledged the abort: from then on the
    # prefill knows the room was given up (before, a busy box could let the prefill compute
    # and WRITE it first). Its request ends fast, not after its timeout.
    await wait_until(lambda: decode.kv_pages_in_use() == 0, what="the prefill acknowledged")
    t0 = time.monotonic()
    p = await asyncio.wait_for(prefill.final(input_ids=ids, sampling_params=GREEDY, **b), 10)
    assert p["meta_info"]["finish_reason"]["type"] == "abort"
    assert time.monotonic() - t0 < TIMEOUTS["bootstrap_timeout"] / 2
    await assert_pools_empty(prefill, decode)


async def test_decode_abort_while_decoding(prefill, decode):
    b = boot(prefill)
    ids = random_prompt(30, decode.vocab_size, seed=2)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=LONG, **b))
    d_stream = await decode.async_generate(input_ids=ids, sampling_params=LONG, stream=True,
                                           rid="d-run", **b)
    first = [await d_stream.__anext__() for _ in range(5)]
    assert all(c["meta_info"]["finish_reason"] is None for c in first)
    assert (await p_task)["meta_info"]["finish_reason"]["type"] == "length"
    decode.tokenizer_manager.abort_request("d-run")
    rest = await asyncio.wait_for(drain(d_stream), 5)
    assert rest[-1]["meta_info"]["finish_reason"]["message"] == "Aborted"
    await assert_pools_empty(prefill, decode)


async def test_prefill_abort_ends_decode(prefill, decode):
    b = boot(prefill)
    ids = random_prompt(40, decode.vocab_size, seed=3)
    p_task = asyncio.create_task(prefill.final(input_ids=ids, sampling_params=GREEDY,
                                               rid="p-abort", **b))
    await asyncio.sleep(0)  # p_task writes its generate command before the abort below
    prefill.abort("p-abort")
    p = await asyncio.wait_for(p_task, 10)
    assert p["meta_info"]["finish_reason"]["type"] == "abort"
    t0 = time.monotonic()
    d = await asyncio.wait_for(
        decode.async_generate(input_ids=ids, sampling_params=GREEDY, **b), 10)
    assert d["meta_info"]["finish_reason"]["type"] == "abort"
    assert d["meta_info"]["finish_reason"]["status_code"] == 500
    assert time.monotonic() - t0 < TIMEOUTS["transfer_timeout"] / 2
    await assert_pools_empty(prefill, decode)


async def test_prefill_times_out_when_decode_never_comes(prefill):
    bound = TIMEOUTS["bootstrap_timeout"]
    t0 = time.monotonic()
    p = await asyncio.wait_for(prefill.final(input_ids=[5, 6, 7], sampling_params=GREEDY,
                                             **boot(prefill)), 15)
    elapsed = time.monotonic() - t0
    reason = p["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and "timed out" in reason["message"]
    assert bound * 0.9 <= elapsed < bound + 5
    assert await prefill.pages_in_use() == 0


async def test_decode_times_out_when_prefill_never_sends(prefill, tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, disaggregation_mode="decode", **SHORT)
    try:
        t0 = time.monotonic()
        d = await asyncio.wait_for(eng.async_generate(input_ids=[5, 6, 7], sampling_params=GREEDY,
                                                      **boot(prefill)), 15)
        elapsed = time.monotonic() - t0
        reason = d["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "timed out" in reason["message"]
        assert reason["status_code"] == 504
        assert SHORT["transfer_timeout"] * 0.9 <= elapsed < SHORT["transfer_timeout"] + 5
        await wait_until(lambda: eng.kv_pages_in_use() == 0, what="decode pool empty")
    finally:
        eng.shutdown()


async def test_killed_prefill_process_ends_decode(decode, tiny_model_path):
    proc = await EngineProcess.start(model_path=tiny_model_path, disaggregation_mode="prefill",
                                     disaggregation_bootstrap_port=0, **TIMEOUTS)
    try:
        # One full request first: the decode's side channel to this prefill is then connected,
        # so the next room's registration goes out at once and the kill is seen as a drop.
        ids = [5, 6, 7, 8]
        p, d = await pair(proc, decode, ids, GREEDY)
        assert d["meta_info"]["finish_reason"]["type"] != "abort"
        stream = await decode.async_generate(input_ids=ids, sampling_params=GREEDY,
                                             stream=True, **boot(proc))
        reading = asyncio.create_task(drain(stream))  # a stream is sent on its first read
        await wait_until(lambda: decode.kv_pages_in_use() > 0, what="decode registered the room")
        t0 = time.monotonic()
        proc.kill()
        chunks = await asyncio.wait_for(reading, 15)
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert time.monotonic() - t0 < TIMEOUTS["transfer_timeout"]
        await wait_until(lambda: decode.kv_pages_in_use() == 0, what="decode pool empty")
    finally:
        await proc.close()


async def test_decode_mode_requires_bootstrap(decode):
    with pytest.raises(ValueError, match="bootstrap"):
        await decode.async_generate(input_ids=[5, 6], sampling_params=GREEDY)


async def test_idle_engines_do_not_burn_cpu(prefill, decode, agg):
    import os

    await assert_pools_empty(prefill, decode)  # nothing pending from earlier tests
    here0, child0 = cpu_seconds(os.getpid()), prefill.cpu_seconds()
    await asyncio.sleep(2.0)
    here = cpu_seconds(os.getpid()) - here0
    child = prefill.cpu_seconds() - child0
    # A spinning NIXL progress thread or busy loop would use ~2 s of CPU here.
    assert here < 0.2, f"idle decode + aggregated engines used {here:.2f} s CPU in 2 s"
    assert child < 0.2, f"idle prefill engine process used {child:.2f} s CPU in 2 s"


async def test_fake_bootstrap_host_moves_no_kv(prefill, decode):
    """SGLang's FAKE_BOOTSTRAP_HOST (health checks, warm-up): each side completes alone."""
    fake = {"bootstrap_host": "2.2.2.2", "bootstrap_port": 1, "bootstrap_room": 0}
    params = {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True}
    p = await asyncio.wait_for(prefill.final(input_ids=[5, 6, 7], sampling_params=params,
                                             **fake), 10)
    assert p["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert len(p["output_ids"]) == 1
    d = await asyncio.wait_for(decode.async_generate(input_ids=[5, 6, 7], sampling_params=params,
                                                     **fake), 10)
    assert d["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    await assert_pools_empty(prefill, decode)
