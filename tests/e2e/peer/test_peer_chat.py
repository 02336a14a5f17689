"""Chat completions as SGLang's and Dynamo's own tests assert them: response and stream shape,
exact usage, model listing. Each test names the peer test it adapts."""

from __future__ import annotations

import pytest

from tests.e2e.client import chat, post
from tests.e2e.peer.wire import MAX_TOKENS, SYSTEM, chat_body, chunks, content_of
from tests.support.topologies import AGG, CONTEXT_LENGTH, DISAGG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _prompt_len(tokenizer, body: dict) -> int:
    return len(tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True,
                                             tokenize=True, return_dict=False))


def test_chat_response_shape_and_exact_usage(stack, model, http, tokenizer):
    """sgl-project/sglang test/srt/openai_server/basic/test_openai_server.py::run_chat_completion
    and ai-dynamo/dynamo tests/utils/payloads.py::DisaggregatedChatPayload: id, created, one
    assistant choice, finish_reason, positive integer usage; here exact counts."""
    body = chat_body(model)
    got = chat(http, stack.url, body)
    assert got["id"] and got["created"] and got["object"] == "chat.completion"
    assert got["model"] == model
    [choice] = got["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    usage = got["usage"]
    assert usage["prompt_tokens"] == _prompt_len(tokenizer, body)
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["total_tokens"] == usage["prompt_tokens"] + MAX_TOKENS


def test_chat_stream_shape_role_first_one_finish_then_usage(stack, model, http, tokenizer):
    """sglang test_openai_server.py::run_chat_completion_stream: the first chunk of a choice
    carries role "assistant", later ones content deltas, exactly one chunk a finish_reason, and
    with stream_options.include_usage one final usage chunk with no choices
    (test_continuous_usage_stats.py::test_continuous_usage_stats_disabled). The deltas add up to
    the non-streamed answer."""
    body = chat_body(model)
    whole = chat(http, stack.url, body)["choices"][0]["message"]["content"]
    events = chunks(http, stack.url, "chat/completions",
                    {**body, "stream_options": {"include_usage": True}})
    *content, last = events
    assert {e["id"] for e in events} == {events[0]["id"]} and events[0]["created"]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in e["choices"][0]["delta"] for e in content[1:])
    finishes = [c["finish_reason"] for e in content for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    assert all(not e.get("usage") for e in content)
    assert last["choices"] == []
    assert last["usage"] == {**last["usage"], "prompt_tokens": _prompt_len(tokenizer, body),
                             "completion_tokens": MAX_TOKENS,
                             "total_tokens": _prompt_len(tokenizer, body) + MAX_TOKENS}
    assert content_of(content) == whole


def test_chat_stream_without_include_usage_has_no_usage_chunk(stack, model, http):
    """sglang test_continuous_usage_stats.py (usage only when asked): a stream without
    stream_options carries no usage anywhere."""
    events = chunks(http, stack.url, "chat/completions", chat_body(model))
    assert events and all(not e.get("usage") for e in events)
    assert all(e["choices"] for e in events)


def test_model_list_names_both_models_with_their_context(stack, http):
    """sglang test_openai_server.py::test_model_list and Dynamo tests/utils/http_checks.py
    ::check_models_api: /v1/models lists the served models. SGLang reports `max_model_len`;
    the Dynamo 1.6.1 frontend reports the context as `context_window` (its answer)."""
    r = http.get(f"{stack.url}/v1/models")
    assert r.status_code == 200, r.text
    listing = r.json()
    assert listing["object"] == "list"
    cards = {m["id"]: m for m in listing["data"]}
    assert set(cards) == {DISAGG, AGG}
    for card in cards.values():
        assert card["object"] == "model" and card["context_window"] == CONTEXT_LENGTH


def test_unknown_model_is_a_404(stack, http):
    """sglang test_openai_server.py::test_retrieve_model (NotFoundError for a non-existent
    model): a request for a model nobody serves is the frontend's 404 "Model not found"."""
    r = post(http, stack.url, "chat/completions",
             {"model": "non-existent-model", "messages": [SYSTEM], "max_tokens": 1})
    assert r.status_code == 404 and "model not found" in r.json()["message"].lower(), r.text
