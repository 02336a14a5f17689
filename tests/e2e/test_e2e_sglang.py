"""The real SGLang engine (SGLang's own CPU path) behind the real frontend, aggregated, in Tokens
and Text mode: greedy output equal to the CPU engine's and transformers', usage, stop conditions,
cancellation (SGLang's own request table back to empty), SGLang's validation errors as 400s,
concurrency, health, registration from the resolved config, and SIGTERM after traffic.

One SGLang stack per input mode is started for the module (an engine start costs 20-40 s here);
the SIGTERM test stops it and so comes last.
"""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest

from tests.e2e.client import chat, error_message, post, stream, user
from tests.e2e.logprobs_checks import check_chat
from tests.support.topologies import AGG, CONTEXT_LENGTH, SGLANG, start_sglang_topology
from harness.topology import wait_until
from tests.e2e.transformers_ref import greedy_ids
from tests.support.structured_schemas import BAD_SCHEMA, SCHEMAS, assert_valid, structured_body

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PROMPTS = ["hello there", "Tell me about the weather in Paris."]
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}


# The Tokens-mode stack's tests are in the SGLang core `make test` runs on SGLang 0.5.21 too.
@pytest.fixture(scope="module", params=[pytest.param("tokens", marks=pytest.mark.sglang_core),
                                        "text"])
def stack(request, tmp_path_factory, tiny_model_path):
    tokens = request.param == "tokens"
    stack = start_sglang_topology(tmp_path_factory.mktemp(f"sglang-{request.param}"),
                                  tiny_model_path, skip_tokenizer_init=tokens)
    stack.mode = request.param
    yield stack
    stack.stop()


def body(model: str, prompt: str, **extra) -> dict:
    return {"model": model, "messages": user(prompt), **GREEDY, **extra}


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer.apply_chat_template(user(prompt), add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def in_flight_settles_to_zero(stack) -> None:
    wait_until(lambda: stack.procs["sglang"].requests_in_flight() == 0, 20,
               "SGLang's request table to empty")


def cancellations(stack) -> int:
    """Requests the worker saw cancelled by the client (it aborts them in SGLang)."""
    return stack.procs["sglang"].log_text().count("cancelled by the client")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_cpu_engine_and_transformers(stack, http, tokenizer,
                                                          tiny_model_path, prompt):
    got = chat(http, stack.url, body(SGLANG, prompt))
    ref = chat(http, stack.url, body(AGG, prompt))
    ids = prompt_ids(tokenizer, prompt)
    expected = tokenizer.decode(greedy_ids(tiny_model_path, ids, GREEDY["max_tokens"]),
                                skip_special_tokens=True)
    assert got["choices"][0]["message"]["content"] == expected
    assert ref["choices"][0]["message"]["content"] == expected
    assert got["choices"][0]["finish_reason"] == "length"
    usage = got["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(ids), 12)
    assert usage["total_tokens"] == len(ids) + 12


def test_streamed_equals_non_streamed_with_usage(stack, http):
    whole = chat(http, stack.url, body(SGLANG, PROMPTS[1]))
    streamed = stream(http, stack.url, "chat/completions", body(SGLANG, PROMPTS[1]))
    assert streamed.error is None and streamed.done
    assert streamed.text == whole["choices"][0]["message"]["content"]
    assert streamed.finish_reason == "length"
    assert streamed.usage["completion_tokens"] == 12


@pytest.mark.parametrize("streaming", [False, True])
def test_max_tokens_one_returns_one_token(stack, http, streaming):
    b = body(SGLANG, PROMPTS[0], max_tokens=1)
    if streaming:
        result = stream(http, stack.url, "chat/completions", b)
        usage, finish = result.usage, result.finish_reason
    else:
        out = chat(http, stack.url, b)
        usage, finish = out["usage"], out["choices"][0]["finish_reason"]
    assert (usage["completion_tokens"], finish) == (1, "length")


def test_n2_returns_two_choices(stack, http):
    out = chat(http, stack.url, {**body(SGLANG, PROMPTS[0]), "temperature": 0.8, "n": 2})
    assert sorted(c["index"] for c in out["choices"]) == [0, 1]
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    assert out["usage"]["completion_tokens"] == 2 * GREEDY["max_tokens"]
    in_flight_settles_to_zero(stack)


def test_stop_string_ends_the_output_before_it(stack, http):
    plain = {"temperature": 0.0, "max_tokens": 12}  # the 1.6.1 frontend drops stops with ignore_eos
    text = chat(http, stack.url, {"model": SGLANG, "messages": user(PROMPTS[1]), **plain}
                )["choices"][0]["message"]["content"]
    assert len(text) >= 4, text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    b = {"model": SGLANG, "messages": user(PROMPTS[1]), **plain, "stop": [stop]}
    for model in (SGLANG, AGG):
        out = chat(http, stack.url, {**b, "model": model})["choices"][0]
        assert (out["finish_reason"], out["message"]["content"]) == ("stop", text[:text.index(stop)])


def test_stop_token_id_ends_the_output(stack, http, tokenizer, tiny_model_path):
    if stack.mode == "text":
        # Seen with both engines: a Text-mode body's stop_token_ids end nothing (1.6.1 frontend).
        pytest.skip("stop_token_ids do not take effect in Text mode behind the 1.6.1 frontend")
    prompt = PROMPTS[1]
    ids = greedy_ids(tiny_model_path, prompt_ids(tokenizer, prompt), 12)
    eos = {tokenizer.eos_token_id, 0, 2}
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i] and ids[i] not in eos)
    b = {"model": SGLANG, "messages": user(prompt), "temperature": 0.0, "max_tokens": 12,
         "stop_token_ids": [ids[k]]}
    ref = chat(http, stack.url, {**b, "model": AGG})
    assert ref["choices"][0]["finish_reason"] == "stop", ("cpu engine", ref)
    out = chat(http, stack.url, b)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["message"]["content"] == tokenizer.decode(ids[:k])
    assert out["usage"]["completion_tokens"] in (k, k + 1)  # the stop token may be counted


@pytest.mark.parametrize("n", [1, 2])  # n=2: SGLang runs one sub-request per choice
def test_cancel_mid_stream_empties_sglangs_request_table(stack, n):
    # The frontend wants a temperature above 0 with n > 1.
    b = {**body(SGLANG, "a long answer please"), "max_tokens": 1500, "stream": True, "n": n,
         "temperature": 0.8}
    before = cancellations(stack)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{stack.url}/v1/chat/completions", json=b) as r:
            assert r.status_code == 200, r.read()
            seen, lines = 0, r.iter_lines()  # held: a dropped line iterator closes the response
            for line in lines:
                seen += line.startswith("data:")
                if seen >= 3 * n:
                    break
            assert seen >= 3 * n
            assert stack.procs["sglang"].requests_in_flight() == n  # still generating
        # leaving the block closed the connection mid-stream
    in_flight_settles_to_zero(stack)
    wait_until(lambda: cancellations(stack) == before + 1, 10, "the worker to cancel it")


@pytest.mark.parametrize("attempt", range(2))  # the disconnect lands at varying stages
def test_cancel_before_first_token_empties_sglangs_request_table(stack, http, attempt):
    b = {**body(SGLANG, "word " * 1500), "max_tokens": 200, "stream": True}
    before = cancellations(stack)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{stack.url}/v1/chat/completions", json=b) as r:
            assert r.status_code == 200  # headers only; close before any token is read
    in_flight_settles_to_zero(stack)
    wait_until(lambda: cancellations(stack) == before + 1, 10, "the worker to cancel it")
    assert chat(http, stack.url, body(SGLANG, "next", max_tokens=2))["usage"]["completion_tokens"] == 2


# Inputs the frontend and the handlers pass on and SGLang's own validation rejects. Text mode
# only: in Tokens mode the frontend drops top_k=0 and keeps min_tokens for itself; out-of-range
# penalties it rejects itself in both modes.
@pytest.mark.parametrize("extra, words", [
    # The handler checks SGLang's ranges where the request enters, in SGLang's words.
    ({"top_k": 0}, "must be -1 (disable) or at least 1, got 0"),
    ({"min_tokens": 9}, "min_new_tokens must be in [0, max_new_tokens(4)], got 9"),
])
def test_sglang_validation_error_is_a_400_with_its_message(stack, http, extra, words):
    if stack.mode != "text":
        pytest.skip("Tokens mode: the frontend validates sampling options itself")
    # Not greedy: SGLang turns temperature 0 into top_k=1 before checking top_k.
    r = post(http, stack.url, "chat/completions",
             {"model": SGLANG, "messages": user("hi"), "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert words in error_message(r), error_message(r)
    in_flight_settles_to_zero(stack)
    assert chat(http, stack.url, body(SGLANG, "still alive?", max_tokens=3))["usage"][
        "completion_tokens"] == 3


def test_over_long_prompt_is_a_400_naming_the_context(stack, http):
    r = post(http, stack.url, "chat/completions",
             body(SGLANG, "word " * (CONTEXT_LENGTH + 10), max_tokens=4))
    assert r.status_code == 400, r.text
    assert "context length" in error_message(r)


def test_structured_output_on_sglangs_xgrammar_backend(stack, http):
    """SGLang's own xgrammar backend runs on its CPU path, in both modes: in Tokens mode SGLang
    still loads its tokenizer, which its grammar backend is built from."""
    r = post(http, stack.url, "chat/completions", structured_body(SCHEMAS["person"]))
    assert r.status_code == 200, r.text
    assert_valid(r.json()["choices"][0]["message"]["content"], SCHEMAS["person"])
    r = post(http, stack.url, "chat/completions", structured_body(BAD_SCHEMA))
    assert r.status_code == 400 and 'Unsupported type "nonsense"' in error_message(r), r.text


def test_sixteen_concurrent_streams_complete_with_exact_counts(stack):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str]:
        b = {**body(SGLANG, f"request number {i}"), "max_tokens": 6 + i % 7, "stream": True,
             "stream_options": {"include_usage": True}}
        usage, finish = None, None
        async with client.stream("POST", f"{stack.url}/v1/chat/completions", json=b) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    data = json.loads(line[5:])
                    assert "error" not in data, data
                    usage = data.get("usage") or usage
                    for c in data.get("choices", []):
                        finish = c.get("finish_reason") or finish
        return usage["completion_tokens"], finish

    async def run() -> list:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(16))), 180)

    assert asyncio.run(run()) == [(6 + i % 7, "length") for i in range(16)]
    in_flight_settles_to_zero(stack)


def test_health_endpoint_reports_the_worker_ready(stack, http):
    proc = stack.procs["sglang"]
    r = http.get(f"http://127.0.0.1:{proc.system_port}/health", timeout=5)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ready", r.text


def test_registration_carries_the_resolved_engine_config(stack):
    card = stack.model_card(SGLANG)
    runtime = card["runtime_config"]
    assert card["kv_cache_block_size"] == 1  # SGLang's resolved page size (none was given)
    assert runtime["context_length"] == CONTEXT_LENGTH
    assert runtime["max_num_seqs"] == 32
    assert 0 < runtime["total_kv_blocks"] <= 8192


def test_logprobs_equal_cpu_engine_and_transformers(stack, http, tokenizer, tiny_model_path):
    # return_logprob / top_logprobs_num on sglang.Engine, read from its meta_info.
    check_chat(http, stack.url, tokenizer, tiny_model_path, PROMPTS[1], model=SGLANG)


def test_prompt_logprobs_and_matched_stop_equal_cpu_engine(stack, http):
    # logprob_start_len=0 and finish_reason["matched"] on sglang.Engine, as the handlers map
    # them (`nvext` shows both: docs/compatibility.md); the CPU engine's `tiny-agg` is the
    # reference. Prompt logprobs: /v1/completions' echo, Tokens mode only.
    ask = {"nvext": {"extra_fields": ["prompt_logprobs", "stop_reason"]}}
    plain = {"messages": user(PROMPTS[1]), "temperature": 0.0, "max_tokens": 12, **ask}
    text = chat(http, stack.url, {"model": AGG, **plain})["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    for model in (SGLANG, AGG):
        out = chat(http, stack.url, {"model": model, **plain, "stop": [stop]})
        assert out["nvext"]["stop_reason"] == stop, (model, out)
    if stack.mode == "text":
        return
    echo = {"prompt": PROMPTS[1], **GREEDY, "echo": True, "logprobs": 3, **ask}
    got, ref = (post(http, stack.url, "completions", {**echo, "model": m}).json()["nvext"]
                for m in (SGLANG, AGG))
    assert got["prompt_logprobs"][0] is None and len(got["prompt_logprobs"]) > 2
    for mine, want in zip(got["prompt_logprobs"][1:], ref["prompt_logprobs"][1:]):
        assert mine.keys() == want.keys()
        assert all(abs(mine[k]["logprob"] - want[k]["logprob"]) < 1e-3 for k in mine)


def test_sigterm_after_traffic_unregisters_drains_and_exits_zero(stack, http):
    """Last in the module: it stops the shared SGLang worker."""
    assert chat(http, stack.url, body(SGLANG, "warm", max_tokens=2))["usage"]["completion_tokens"] == 2
    proc = stack.procs["sglang"]
    b = {**body(SGLANG, "a long answer please"), "max_tokens": 60}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{stack.url}/v1/chat/completions",
                           json={**b, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))  # in flight now
            proc.popen.send_signal(signal.SIGTERM)  # the worker alone, not its group
            rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]" and '"length"' in "".join(rest), rest[-3:]
    assert proc.popen.wait(60) == 0, proc.log_text()[-3000:]
    wait_until(lambda: SGLANG not in stack.models(), 15, f"{SGLANG} to leave /v1/models")
    assert "shutting down: unregistering" in proc.log_text()
