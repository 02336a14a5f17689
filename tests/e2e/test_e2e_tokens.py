"""Tokens mode (--skip-tokenizer-init) through the real frontend: disaggregated decode+prefill
vs an aggregated worker, streaming and not, /v1/completions, stop conditions, concurrency,
bad requests, and KV pages freed after client disconnects; in both orchestration styles, with file
discovery + TCP and with etcd + NATS."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from harness.topology import wait_until
from tests.e2e.choices_checks import SEEDED_N, TOP_K_N, assert_choices_equal
from tests.e2e.client import chat, completion, error_message, leave_mid_stream, post, stream, user
from tests.e2e.logprobs_checks import check_chat, check_completions, check_prompt_logprobs
from tests.support.shared_stacks import (
    TOKENS, TOKENS_ETCD, TOKENS_FRONTEND, TOKENS_FRONTEND_ETCD, lease,
)
from tests.support.topologies import AGG, CONTEXT_LENGTH, DISAGG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module",
                params=[TOKENS, TOKENS_FRONTEND, TOKENS_ETCD, TOKENS_FRONTEND_ETCD],
                ids=["decode-orch", "frontend-orch", "decode-orch-etcd", "frontend-orch-etcd"])
def tokens_stack(request):
    """This module's checks hold for both orchestration styles, each with file discovery + TCP
    and with etcd + NATS (one etcd and NATS for the session, one namespace per stack); the
    stacks are shared with other modules (tests/support/shared_stacks.py)."""
    yield from lease(request, request.param)


PROMPTS = ["hello there", "Tell me about the weather in Paris.", "1 2 3 4 5 6 7"]
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}


def chat_body(model: str, prompt: str, **extra) -> dict:
    return {"model": model, "messages": user(prompt), **GREEDY, **extra}


def prompt_len(tokenizer, prompt: str) -> int:
    return len(tokenizer.apply_chat_template(user(prompt), add_generation_prompt=True,
                                             tokenize=True, return_dict=False))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chat_disagg_equals_agg_with_exact_usage(tokens_stack, http, tokenizer, prompt):
    got = chat(http, tokens_stack.url, chat_body(DISAGG, prompt))
    ref = chat(http, tokens_stack.url, chat_body(AGG, prompt))
    assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
    assert got["choices"][0]["finish_reason"] == "length"
    usage = got["usage"]
    assert usage["completion_tokens"] == GREEDY["max_tokens"]
    assert usage["prompt_tokens"] == prompt_len(tokenizer, prompt)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("sampling", [TOP_K_N, SEEDED_N], ids=["top-k", "seeded-logprobs"])
def test_n3_disagg_equals_agg_choice_by_choice(tokens_stack, http, sampling):
    """The prompt is prefilled once and its KV moved once (both styles: the frontend sends n
    on both legs with its one bootstrap_info); the decode forks it into the choices."""
    texts = assert_choices_equal(http, tokens_stack.url, DISAGG, AGG,
                                 {"messages": user(PROMPTS[1]), **sampling})
    if sampling is SEEDED_N:
        assert len(set(texts)) > 1, texts  # each choice samples on its own


def test_streamed_chat_equals_non_streamed(tokens_stack, http):
    body = chat_body(DISAGG, PROMPTS[1])
    whole = chat(http, tokens_stack.url, body)
    streamed = stream(http, tokens_stack.url, "chat/completions", body)
    assert streamed.error is None and streamed.done
    assert streamed.text == whole["choices"][0]["message"]["content"]
    assert streamed.finish_reason == "length"
    assert streamed.roles == ["assistant"]
    assert streamed.usage["completion_tokens"] == GREEDY["max_tokens"]


@pytest.mark.parametrize("prompt", ["Once upon a time", [5, 6, 7, 8, 9, 10]])
def test_completions_disagg_equals_agg(tokens_stack, http, prompt):
    body = {"prompt": prompt, **GREEDY}
    got = completion(http, tokens_stack.url, {"model": DISAGG, **body})
    ref = completion(http, tokens_stack.url, {"model": AGG, **body})
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]
    assert got["usage"]["completion_tokens"] == GREEDY["max_tokens"]
    if isinstance(prompt, list):
        assert got["usage"]["prompt_tokens"] == len(prompt)
    streamed = stream(http, tokens_stack.url, "completions", {"model": DISAGG, **body})
    assert streamed.text == got["choices"][0]["text"]


@pytest.mark.parametrize("streaming", [False, True])
def test_max_tokens_one_returns_one_token(tokens_stack, http, streaming):
    body = chat_body(DISAGG, PROMPTS[0], max_tokens=1)
    if streaming:
        result = stream(http, tokens_stack.url, "chat/completions", body)
        usage, finish = result.usage, result.finish_reason
    else:
        out = chat(http, tokens_stack.url, body)
        usage, finish = out["usage"], out["choices"][0]["finish_reason"]
    assert usage["completion_tokens"] == 1
    assert finish == "length"


def test_stop_string_ends_the_stream_before_it(tokens_stack, http):
    # No ignore_eos here: with it, the 1.6.1 frontend drops the request's stop conditions.
    plain = {"temperature": 0.0, "max_tokens": 12}
    full = chat(http, tokens_stack.url, {"model": DISAGG, "messages": user(PROMPTS[1]), **plain})
    text = full["choices"][0]["message"]["content"]
    assert len(text) >= 4, text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    expected = text[:text.index(stop)]
    body = {"model": DISAGG, "messages": user(PROMPTS[1]), **plain, "stop": [stop]}
    out = chat(http, tokens_stack.url, body)["choices"][0]
    streamed = stream(http, tokens_stack.url, "chat/completions", body)
    assert (out["finish_reason"], streamed.finish_reason) == ("stop", "stop"), (stop, out)
    assert out["message"]["content"] == expected
    assert streamed.text == expected


@pytest.fixture(scope="module")
def ref_engine(tiny_model_path):
    """The CPU engine in this process, aggregated: the reference for greedy token ids."""
    from components.engine.process.engine import CpuEngine

    engine = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True,
                    context_length=CONTEXT_LENGTH, max_total_tokens=8192)
    yield engine
    engine.shutdown()


def reference_ids(engine, prompt: list[int], n: int) -> list[int]:
    params = {"max_new_tokens": n, "temperature": 0.0}
    out = asyncio.run(engine.async_generate(input_ids=prompt, sampling_params=params))
    return list(out["output_ids"])


def test_stop_token_ids_end_the_stream(tokens_stack, http, ref_engine, tokenizer):
    prompt, plain = [11, 12, 13, 14, 15], {"temperature": 0.0, "max_tokens": 12}
    ids = reference_ids(ref_engine, prompt, plain["max_tokens"])
    full = completion(http, tokens_stack.url, {"model": DISAGG, "prompt": prompt, **plain})
    assert full["usage"]["completion_tokens"] == len(ids)  # same greedy run as in-process
    # The first token past the start that did not occur before it: the stop lands there.
    eos = {tokenizer.eos_token_id, 0, 2}
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i] and ids[i] not in eos)
    body = {"prompt": prompt, **plain, "stop_token_ids": [ids[k]]}
    got = completion(http, tokens_stack.url, {"model": DISAGG, **body})
    ref = completion(http, tokens_stack.url, {"model": AGG, **body})
    assert got["choices"][0]["finish_reason"] == "stop"
    assert got["choices"][0]["text"] == ref["choices"][0]["text"]
    assert got["usage"]["completion_tokens"] in (k, k + 1)  # the stop token may be counted


def test_sixteen_concurrent_streams_complete_with_exact_counts(tokens_stack):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int, str]:
        n = 6 + i % 7
        body = {"model": DISAGG, "messages": user(f"request number {i}"), "max_tokens": n,
                "temperature": 0.0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        usage, finish = None, None
        async with client.stream("POST", f"{tokens_stack.url}/v1/chat/completions",
                                 json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    data = json.loads(line[5:])
                    assert "error" not in data, data
                    usage = data.get("usage") or usage
                    for c in data.get("choices", []):
                        finish = c.get("finish_reason") or finish
        return n, usage["completion_tokens"], finish

    async def run() -> list:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(16))), 180)

    results = asyncio.run(run())
    assert [(want, "length") for want, _, _ in results] == [(got, f) for _, got, f in results]


# The frontend validates what it can itself (Tokens mode) and words those messages; the rest
# reaches the worker, which raises InvalidArgument with its own message.
@pytest.mark.parametrize("path, body, words", [
    ("chat/completions", {"messages": []}, ["messages"]),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, ["wizard"]),
    ("chat/completions", {"messages": user("hi"), "max_tokens": -1}, ["-1"]),
    ("chat/completions", {"messages": user("hi"), "temperature": -0.5}, ["temperature"]),
    # 1.6.1's frontend checks prompt ids against its tokenizer itself and says only "Invalid
    # request"; the worker never sees them. Text mode's nvext.token_data reaches the worker,
    # whose message names the id (test_e2e_text.py).
    ("completions", {"prompt": [1, 2, 99999]}, ["invalid request"]),
    ("completions", {"prompt": [7] * (CONTEXT_LENGTH + 10)}, ["context"]),
])
def test_bad_request_is_a_400_naming_the_problem_then_service_continues(
        tokens_stack, http, path, body, words):
    r = post(http, tokens_stack.url, path, {"model": DISAGG, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    message = error_message(r).lower()
    assert all(w.lower() in message for w in words), message
    ok = chat(http, tokens_stack.url, chat_body(DISAGG, "still alive?", max_tokens=3))
    assert ok["usage"]["completion_tokens"] == 3


def _pages_settle_to_zero(stack) -> None:
    def idle() -> bool:
        return all(stack.procs[n].kv_pages_in_use() == 0 for n in ("prefill", "decode"))

    wait_until(idle, 15, "prefill and decode KV pages back to 0")


def test_disconnect_mid_stream_frees_all_pages(tokens_stack):
    body = {"model": DISAGG, "messages": user("a long answer please"), "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    assert leave_mid_stream(tokens_stack.url, body) >= 3
    _pages_settle_to_zero(tokens_stack)


@pytest.mark.parametrize("attempt", range(3))  # the disconnect lands at varying stages
def test_disconnect_before_first_token_frees_all_pages(tokens_stack, http, attempt):
    body = {"model": DISAGG, "prompt": [9] * 1800, "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{tokens_stack.url}/v1/completions", json=body) as r:
            assert r.status_code == 200  # headers only; close before any token is read
    _pages_settle_to_zero(tokens_stack)
    ok = chat(http, tokens_stack.url, chat_body(DISAGG, "next", max_tokens=2))
    assert ok["usage"]["completion_tokens"] == 2


def test_chat_logprobs_match_transformers_and_aggregated(tokens_stack, http, tokenizer,
                                                         tiny_model_path):
    check_chat(http, tokens_stack.url, tokenizer, tiny_model_path, PROMPTS[1])


def test_completions_logprobs_match_transformers_and_aggregated(tokens_stack, http, tokenizer,
                                                                tiny_model_path):
    check_completions(http, tokens_stack.url, tokenizer, tiny_model_path, "Once upon a time")


def test_prompt_logprobs_disaggregated_equal_aggregated(tokens_stack, http, tokenizer):
    # Computed by the prefill, sent to the decode over the room watch (both styles).
    check_prompt_logprobs(http, tokens_stack.url, tokenizer, "Once upon a time, the sea")
