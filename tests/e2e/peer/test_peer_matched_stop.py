"""SGLang's `matched_stop` (test/srt/openai_server/validation/test_matched_stop.py): which stop
string or token ended a choice, None for "length". The Dynamo 1.6.1 frontend has no such field
on a choice and drops it from what a worker yields; it shows the same value as
`nvext.stop_reason` when the body names it in `nvext.extra_fields` (Tokens mode: from the stop
it matched itself, or the worker's `stop_reason`; Text mode: the worker's own `nvext`). So the
peer's `choices[0]["matched_stop"]` is asserted as `nvext["stop_reason"]`, the rest as is."""

from __future__ import annotations

import pytest

from tests.e2e.client import chat, completion
from tests.e2e.peer.wire import chat_body, chunks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LONG = 16
# No ignore_eos with stop conditions: the 1.6.1 frontend then forwards none (Tokens mode).
PLAIN = {"ignore_eos": False, "max_tokens": LONG}
ASK = {"nvext": {"extra_fields": ["stop_reason"]}}


def _stop_in(text: str) -> str:
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), text
    return stop


def _matched(response: dict):
    return (response.get("nvext") or {}).get("stop_reason")


def test_finish_stop_str(stack, model, http):
    """test_finish_stop_str, chat: a generated stop string ends the choice, "stop", and it is
    the matched stop."""
    whole = chat(http, stack.url, chat_body(model, **PLAIN))["choices"][0]["message"]["content"]
    stop = _stop_in(whole)
    got = chat(http, stack.url, chat_body(model, **PLAIN, stop=[stop], **ASK))
    assert got["choices"][0]["finish_reason"] == "stop" and _matched(got) == stop


def test_finish_stop_str_streamed(stack, model, http):
    """The same, streamed: the finishing chunk carries the matched stop, no earlier one does."""
    whole = chat(http, stack.url, chat_body(model, **PLAIN))["choices"][0]["message"]["content"]
    stop = _stop_in(whole)
    events = chunks(http, stack.url, "chat/completions",
                    chat_body(model, **PLAIN, stop=[stop], **ASK))
    finishing = [e for e in events if any(c.get("finish_reason") for c in e["choices"])]
    assert [e["choices"][0]["finish_reason"] for e in finishing] == ["stop"]
    assert _matched(finishing[0]) == stop
    assert all(_matched(e) is None for e in events if e not in finishing)


def test_finish_stop_str_completions(stack, model, http):
    """test_finish_stop_str, /v1/completions (Tokens mode: Text mode serves chat only)."""
    if not stack.tokens:
        pytest.skip("Text mode serves chat only (test_text_mode_has_no_completions)")
    body = {"model": model, "prompt": "The sea is", "temperature": 0, **PLAIN}
    stop = _stop_in(completion(http, stack.url, body)["choices"][0]["text"])
    got = completion(http, stack.url, {**body, "stop": [stop], **ASK})
    assert got["choices"][0]["finish_reason"] == "stop" and _matched(got) == stop


def test_finish_stop_token(stack, model, http, greedy_ids):
    """test_finish_stop_eos with a stop token id from the greedy answer (the random model's EOS
    is not predictable): the id is the matched stop. Tokens mode: the Text-mode frontend does
    not forward `stop_token_ids` (test_peer_sampling.py::test_stop_token_id_ends_the_answer)."""
    if not stack.tokens:
        pytest.skip("the 1.6.1 frontend forwards no stop_token_ids in Text mode")
    body = chat_body(model, **PLAIN)
    ids = greedy_ids(body["messages"], LONG)
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    got = chat(http, stack.url, {**body, "stop_token_ids": [ids[k]], **ASK})
    assert got["choices"][0]["finish_reason"] == "stop" and _matched(got) == ids[k]


def test_finish_length(stack, model, http):
    """test_finish_length: max_tokens ends the choice, "length", and nothing matched."""
    got = chat(http, stack.url, chat_body(model, **ASK))
    assert got["choices"][0]["finish_reason"] == "length" and _matched(got) is None
