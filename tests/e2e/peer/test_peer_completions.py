"""/v1/completions as SGLang's test_openai_server.py::run_completion(_stream) asserts it, with
the prompt as a string, as token ids and as a list of prompts. Tokens mode only: a Text-mode
worker registers chat alone (docs/reference/input-modes.md)."""

from __future__ import annotations

import pytest

from tests.e2e.client import completion, post
from tests.e2e.peer.wire import MAX_TOKENS, chunks, error_body

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROMPT = "The sea is"


@pytest.fixture
def tokens_stack(stack):
    if not stack.tokens:
        pytest.skip("Text mode serves chat only (test_text_mode_has_no_completions)")
    return stack


def _body(model: str, prompt, **extra) -> dict:
    return {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, **extra}


@pytest.mark.parametrize("as_ids", [False, True], ids=["string", "token-ids"])
def test_completion_shape_and_exact_usage(tokens_stack, model, http, tokenizer, as_ids):
    """sglang test_openai_server.py::run_completion (token_input False/True): one choice with
    text, id, created, prompt_tokens equal to the prompt's token count; Dynamo
    tests/utils/payloads.py::CompletionPayload (choices[0].text present)."""
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    got = completion(http, tokens_stack.url, _body(model, ids if as_ids else PROMPT))
    assert got["id"] and got["created"] and got["object"] == "text_completion"
    [choice] = got["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] == "length"
    assert got["usage"]["prompt_tokens"] == len(tokenizer.encode(PROMPT))
    assert got["usage"]["completion_tokens"] == MAX_TOKENS
    assert got["usage"]["total_tokens"] == got["usage"]["prompt_tokens"] + MAX_TOKENS


def test_string_and_token_prompts_give_the_same_answer(tokens_stack, model, http, tokenizer):
    """sglang run_completion's token_input switch: the same prompt as ids is the same request."""
    ids = tokenizer.encode(PROMPT)
    as_text = completion(http, tokens_stack.url, _body(model, PROMPT))
    as_ids = completion(http, tokens_stack.url, _body(model, ids))
    assert as_text["choices"][0]["text"] == as_ids["choices"][0]["text"]


def test_list_of_prompts_gives_one_choice_each(tokens_stack, model, http, tokenizer):
    """sglang run_completion (use_list_input): two prompts, two choices (index 0 and 1), usage
    summed over both; each choice equals its prompt sent alone."""
    prompts = [PROMPT, "Write one line"]
    got = completion(http, tokens_stack.url, _body(model, prompts))
    assert [c["index"] for c in got["choices"]] == [0, 1]
    alone = [completion(http, tokens_stack.url, _body(model, p))["choices"][0]["text"]
             for p in prompts]
    assert [c["text"] for c in got["choices"]] == alone
    assert got["usage"]["prompt_tokens"] == sum(len(tokenizer.encode(p)) for p in prompts)
    assert got["usage"]["completion_tokens"] == 2 * MAX_TOKENS


def test_completion_stream_with_usage(tokens_stack, model, http, tokenizer):
    """sglang test_openai_server.py::run_completion_stream: every chunk has id and created, the
    text deltas add up to the whole answer, one finish_reason, and a final usage chunk."""
    body = _body(model, PROMPT)
    whole = completion(http, tokens_stack.url, body)["choices"][0]["text"]
    *content, last = chunks(http, tokens_stack.url, "completions",
                            {**body, "stream_options": {"include_usage": True}})
    assert all(e["id"] and e["created"] for e in content)
    assert "".join(c["text"] for e in content for c in e["choices"]) == whole
    finishes = [c.get("finish_reason") for e in content for c in e["choices"]]
    assert [f for f in finishes if f] == ["length"]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == MAX_TOKENS
    assert last["usage"]["prompt_tokens"] == len(tokenizer.encode(PROMPT))


@pytest.mark.parametrize("prompt, words", [("", ["prompt string cannot be empty"]),
                                           ([], ["prompt string array cannot be empty"])])
def test_empty_prompt_is_the_frontends_400(tokens_stack, http, prompt, words):
    """Dynamo tests/utils/payloads.py::HttpErrorPayload: the 1.6.1 frontend refuses an empty
    prompt itself, with a 400 saying so."""
    message = error_body(post(http, tokens_stack.url, "completions",
                              _body("tiny", prompt)))["message"].lower()
    assert all(w in message for w in words), message


def test_text_mode_has_no_completions(stack, http):
    """sglang run_completion against a Text-mode worker: it registers `ModelType.Chat` only, so
    the frontend answers /v1/completions with its 404 (docs/reference/input-modes.md)."""
    if stack.tokens:
        pytest.skip("Tokens mode serves /v1/completions")
    r = post(http, stack.url, "completions", _body("tiny", PROMPT))
    assert r.status_code == 404, r.text
