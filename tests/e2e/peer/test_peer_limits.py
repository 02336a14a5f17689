"""Length rules and bad requests as the peers assert them: prompt and max_tokens against the
context, and the error shape. Where the Dynamo 1.6.1 frontend answers before any worker sees
the request, the test asserts the frontend's answer and says so (docs/compatibility.md)."""

from __future__ import annotations

import re

import pytest

from tests.e2e.client import chat, post, user
from tests.e2e.peer.wire import chat_body, error_body
from tests.support.topologies import CONTEXT_LENGTH

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _words(n: int) -> str:
    return "word " * n  # one token per word on the tiny tokenizer, plus the template's


def test_prompt_longer_than_the_context_is_a_400(stack, model, http):
    """sglang test/srt/openai_server/validation/test_request_length_validation.py
    ::test_input_length_longer_than_context_length: a 400 saying the prompt is longer than the
    context, with its length and the context's."""
    r = post(http, stack.url, "chat/completions",
             {"model": model, "messages": user(_words(CONTEXT_LENGTH + 50))})
    message = error_body(r)["message"]
    assert "prompt is too long" in message and f"{CONTEXT_LENGTH} tokens" in message, message
    assert re.search(r"\b2\d{3} tokens", message.replace(str(CONTEXT_LENGTH), "")), message


def test_max_tokens_past_the_context_is_a_400_naming_both_numbers(stack, model, http, tokenizer):
    """sglang test_request_length_validation.py::test_max_tokens_validation: "Requested token
    count exceeds the model's maximum context", here with the prompt's and max_tokens' counts."""
    body = {"model": model, "messages": user(_words(1000)), "max_tokens": 1500}
    prompt = len(tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                               tokenize=True, return_dict=False))
    message = error_body(post(http, stack.url, "chat/completions", body))["message"]
    assert "Requested token count exceeds the model's maximum context" in message, message
    assert f"{CONTEXT_LENGTH} tokens" in message and f"{prompt + 1500} tokens" in message
    assert f"{prompt} tokens from the input" in message and "1500 tokens for the completion" \
        in message, message


def test_no_max_tokens_generates_up_to_the_context(stack, model, http):
    """sglang test/srt/openai_server/validation/test_large_max_new_tokens.py (no max_tokens is
    bounded by the context, not a fixed default): a prompt a few tokens short of the context
    runs to exactly the context with finish_reason "length"."""
    got = chat(http, stack.url, {"model": model, "messages": user(_words(CONTEXT_LENGTH - 20)),
                                 "temperature": 0, "ignore_eos": True})
    usage = got["usage"]
    assert usage["total_tokens"] == CONTEXT_LENGTH and 0 < usage["completion_tokens"] < 20
    assert got["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("extra, words", [
    ({"max_tokens": 0}, ["max tokens", "greater than 0", "got 0"]),
    ({"max_tokens": -1}, ["-1", "u32"]),
    ({"max_tokens": "four"}, ["four", "u32"]),
    ({"temperature": -1}, ["temperature", "0 and 2", "-1"]),
    ({"top_p": 1.5}, ["top_p", "0 and 1", "1.5"]),
    ({"messages": []}, ["messages", "cannot be empty"]),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, ["unknown variant", "wizard"]),
    ({"messages": "hi"}, ["expected a sequence"]),
    ({"n": 2, "temperature": 0}, ["n > 1", "temperature must be greater than 0"]),
    ({"echo": True}, ["unsupported parameter", "echo"]),
    ({"regex": "[a-z]+"}, ["unsupported parameter", "regex"]),
    ({"logprobs": True, "top_logprobs": 25}, ["top_logprobs", "0 and 20", "25"]),
    ({"stream": False, "stream_options": {"include_usage": True}}, ["stream_options", "stream"]),
])
def test_the_frontend_refuses_bad_bodies_itself(stack, http, extra, words):
    """sglang test_openai_server.py (TestOpenAIServerv1Responses::test_error: a 400 with
    message, type and code) and Dynamo tests/utils/payloads.py::HttpErrorPayload: each of these
    bodies is refused by the Dynamo 1.6.1 frontend, in both modes, with a 400 whose message names
    the problem. Dynamo's error object is top-level (`{"message", "type", "code"}`), not nested
    under "error" as SGLang's. Service goes on afterwards."""
    body = {**chat_body("tiny"), **extra}
    err = error_body(post(http, stack.url, "chat/completions", body))
    assert err["type"] == "Bad Request"
    message = err["message"].lower()
    assert all(w in message for w in words), message
    assert chat(http, stack.url, chat_body("tiny", max_tokens=1))["usage"]["completion_tokens"] == 1
