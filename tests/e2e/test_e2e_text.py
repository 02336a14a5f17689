"""Text mode (no --skip-tokenizer-init): the decode worker renders the chat template and
tokenizes, off its event loop; disaggregated output equals aggregated output."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from tests.e2e.choices_checks import SEEDED_N, TOP_K_N, assert_choices_equal
from tests.e2e.client import chat, error_message, post, stream, user
from tests.e2e.logprobs_checks import check_chat
from tests.support.shared_stacks import TEXT
from tests.support.topologies import AGG, CONTEXT_LENGTH, DISAGG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
# Its text_stack is the shared Text stack (tests/support/shared_stacks.py): the suite runs its
# users together.
SHARED_STACK = TEXT

GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
PROMPTS = ["hello there", "Write about the sea, in one line."]


def body(model: str, prompt: str, **extra) -> dict:
    return {"model": model, "messages": user(prompt), **GREEDY, **extra}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_text_chat_disagg_equals_agg_with_exact_usage(text_stack, http, tokenizer, prompt):
    got = chat(http, text_stack.url, body(DISAGG, prompt))
    ref = chat(http, text_stack.url, body(AGG, prompt))
    assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
    assert got["choices"][0]["finish_reason"] == "length"
    prompt_ids = tokenizer.apply_chat_template(user(prompt), add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    assert got["usage"]["prompt_tokens"] == len(prompt_ids)
    assert got["usage"]["completion_tokens"] == GREEDY["max_tokens"]


@pytest.mark.parametrize("sampling", [TOP_K_N, SEEDED_N], ids=["top-k", "seeded-logprobs"])
def test_text_n3_disagg_equals_agg_choice_by_choice(text_stack, http, sampling):
    texts = assert_choices_equal(http, text_stack.url, DISAGG, AGG,
                                 {"messages": user(PROMPTS[1]), **sampling})
    if sampling is SEEDED_N:
        assert len(set(texts)) > 1, texts


def test_text_stream_equals_whole_with_role_once_and_usage(text_stack, http):
    req = body(DISAGG, PROMPTS[1])
    whole = chat(http, text_stack.url, req)["choices"][0]["message"]["content"]
    streamed = stream(http, text_stack.url, "chat/completions", req)
    assert streamed.error is None and streamed.done
    assert streamed.text == whole
    assert streamed.roles == ["assistant"]
    assert streamed.finish_reason == "length"
    assert streamed.usage["completion_tokens"] == GREEDY["max_tokens"]


def test_text_max_tokens_one_and_stop_string(text_stack, http):
    one = chat(http, text_stack.url, body(DISAGG, PROMPTS[0], max_tokens=1))
    assert one["usage"]["completion_tokens"] == 1
    text = chat(http, text_stack.url, body(DISAGG, PROMPTS[1]))["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 3].strip() or text[-2:]
    got = stream(http, text_stack.url, "chat/completions", body(DISAGG, PROMPTS[1], stop=[stop]))
    assert got.finish_reason == "stop"
    assert got.text == text[:text.index(stop)]


@pytest.mark.parametrize("extra, words", [
    ({"messages": []}, ["messages"]),
    # The frontend parses the body even in Text mode and words these two itself.
    ({"messages": [{"role": "wizard", "content": "hi"}]}, ["wizard"]),
    ({"max_tokens": -1}, ["-1"]),
    ({"temperature": -0.5}, ["temperature"]),
    ({"messages": user("word " * (CONTEXT_LENGTH + 100))}, ["context"]),
    # A pre-tokenized prompt reaches the worker unchecked; the worker names the bad id.
    ({"nvext": {"token_data": [1, 2, 99999]}}, ["99999", "out of vocabulary"]),
    ({"logprobs": True, "top_logprobs": 21}, ["top_logprobs", "20"]),
])
def test_text_bad_request_is_a_400_naming_the_problem(text_stack, http, extra, words):
    r = post(http, text_stack.url, "chat/completions",
             {"model": DISAGG, "messages": user("hi"), "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    message = error_message(r).lower()
    assert all(w in message for w in words), message
    ok = chat(http, text_stack.url, body(DISAGG, "still there?", max_tokens=2))
    assert ok["usage"]["completion_tokens"] == 2


def _long_text(min_tokens: int, tokenizer) -> str:
    rng = random.Random(0)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    text = " ".join(f"{rng.choice(words)}{rng.randint(0, 999)}" for _ in range(min_tokens // 5))
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < min_tokens:
        text += " " + text
    return text


def test_long_preprocessing_does_not_stall_other_streams(text_stack, tokenizer):
    """A >= 1M-token prompt is templated and tokenized (then rejected: longer than the
    context) while short streams on the same decode worker keep receiving tokens. The short
    streams follow one another until the long request has ended, so a slow tokenization on a
    loaded machine cannot outlast them."""
    long_text = _long_text(1_000_000, tokenizer)
    short = {"model": DISAGG, "messages": user("keep talking"), "max_tokens": 1800,
             "temperature": 0.0, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    starts: set[int] = set()  # indexes in arrivals of each stream's first token
    started = threading.Event()
    t_end = float("inf")  # when the long request ended (the closure reads the variable's value)

    def covered() -> bool:  # tokens kept arriving for a second after the long request
        return arrivals[-1] > t_end + 1.0

    def run_short() -> None:
        with httpx.Client(timeout=120) as client:
            while not (arrivals and covered()):
                with client.stream("POST", f"{text_stack.url}/v1/chat/completions",
                                   json=short) as r:
                    if r.status_code != 200:
                        return  # the asserts below report the missing tokens
                    starts.add(len(arrivals))
                    for line in r.iter_lines():
                        if '"content"' in line:
                            arrivals.append(time.monotonic())
                            if len(arrivals) == 5:
                                started.set()
                            if covered():
                                return

    reader = threading.Thread(target=run_short, daemon=True)
    reader.start()
    assert started.wait(60), "the short stream never started"
    with httpx.Client(timeout=120) as client:
        t0 = time.monotonic()
        r = client.post(f"{text_stack.url}/v1/chat/completions",
                        json={"model": DISAGG, "messages": user(long_text), "max_tokens": 4})
        t1 = time.monotonic()
    t_end = t1
    reader.join(120)
    assert not reader.is_alive(), "the short streams did not end"
    assert r.status_code == 400 and "context" in error_message(r).lower(), r.text[:300]
    preprocess_s = t1 - t0
    assert arrivals[-1] > t1, "the short streams ended before the long request was rejected"
    # Every gap between consecutive tokens of one stream that overlaps the long request's
    # lifetime (a new stream's first token waits for its own tokenization, queued behind the
    # long one: not a stall).
    gaps = [arrivals[i] - arrivals[i - 1] for i in range(1, len(arrivals))
            if i not in starts and arrivals[i] >= t0 and arrivals[i - 1] <= t1]
    assert preprocess_s > 0.6, f"preprocessing took only {preprocess_s:.3f}s: not a test"
    assert len(gaps) >= 5, f"only {len(gaps)} tokens arrived in {preprocess_s:.2f}s"
    print(f"long request {preprocess_s:.2f}s, max token gap {max(gaps) * 1000:.0f}ms")
    # Tokenized on the event loop, the longest gap would be about the whole tokenization; a
    # machine the suite keeps busy gives gaps of a few tenths of a second either way.
    assert max(gaps) < preprocess_s / 2, (max(gaps), preprocess_s)


def test_text_chat_logprobs_match_transformers_and_aggregated(text_stack, http, tokenizer,
                                                              tiny_model_path):
    check_chat(http, text_stack.url, tokenizer, tiny_model_path, PROMPTS[1])
