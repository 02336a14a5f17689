"""Sampling parameters as the peers assert them: stop strings and ids, penalties (ranges and
errors), seeded determinism, ignore_eos and min_tokens. The tiny model is random, so where a
peer asserts an answer ("Paris") this suite asserts what the parameter must do to any answer."""

from __future__ import annotations

import pytest

from tests.e2e.client import chat, post
from tests.e2e.peer.wire import chat_body, error_body

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LONG = 16
# No ignore_eos with stop conditions: in Tokens mode the 1.6.1 frontend drops the request's
# stop conditions when ignore_eos is set (`test_ignore_eos_drops_stop_conditions_in_tokens_mode`).
PLAIN = {"ignore_eos": False, "max_tokens": LONG}


def _answer(http, url: str, body: dict) -> tuple[str, dict]:
    got = chat(http, url, body)
    return got["choices"][0]["message"]["content"], got


def test_stop_string_ends_the_answer_before_it(stack, model, http):
    """sglang test/srt/openai_server/validation/test_matched_stop.py::test_finish_stop_str:
    finish_reason "stop" when a stop string is generated; the text ends before the stop string.
    (SGLang's `matched_stop` is `nvext.stop_reason` behind the 1.6.1 frontend:
    test_peer_matched_stop.py.)"""
    whole, _ = _answer(http, stack.url, chat_body(model, **PLAIN))
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    assert stop.strip(), whole
    text, got = _answer(http, stack.url, chat_body(model, **PLAIN, stop=[stop]))
    assert got["choices"][0]["finish_reason"] == "stop"
    assert text == whole[:whole.index(stop)]
    assert got["usage"]["completion_tokens"] < LONG


def test_ignore_eos_drops_stop_conditions_in_tokens_mode(stack, model, http):
    """The Dynamo 1.6.1 frontend's answer (Tokens mode): with `ignore_eos` it forwards no stop
    conditions, so a stop string the answer contains does not end it; in Text mode the worker
    reads the body and honours both (SGLang's behaviour: ignore_eos ignores EOS only)."""
    whole, _ = _answer(http, stack.url, chat_body(model, max_tokens=LONG))
    stop = whole[len(whole) // 2:len(whole) // 2 + 2]
    text, got = _answer(http, stack.url, chat_body(model, max_tokens=LONG, stop=[stop]))
    if stack.tokens:
        assert (text, got["choices"][0]["finish_reason"]) == (whole, "length")
    else:
        assert (text, got["choices"][0]["finish_reason"]) == (whole[:whole.index(stop)], "stop")


def _fresh_id(ids: list[int]) -> int:
    """The first position past the second whose id did not occur before it."""
    return next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])


def test_stop_token_id_ends_the_answer(stack, model, http, tokenizer, greedy_ids):
    """sglang test_matched_stop.py::test_finish_stop_eos (a stop token id ends the answer with
    finish_reason "stop") with a token id taken from the greedy answer instead of Llama's EOS.
    Text mode: the Dynamo 1.6.1 frontend does not pass `stop_token_ids` on in the body it
    forwards, so they end nothing (its answer: the whole answer, "length")."""
    body = chat_body(model, **PLAIN)
    ids = greedy_ids(body["messages"], LONG)
    whole, ref = _answer(http, stack.url, body)
    assert ref["usage"]["completion_tokens"] == LONG and whole == tokenizer.decode(ids)
    k = _fresh_id(ids)
    text, got = _answer(http, stack.url, {**body, "stop_token_ids": [ids[k]]})
    if not stack.tokens:
        assert (text, got["choices"][0]["finish_reason"]) == (whole, "length")
        return
    assert got["choices"][0]["finish_reason"] == "stop"
    assert text == tokenizer.decode(ids[:k])
    assert got["usage"]["completion_tokens"] in (k, k + 1)  # the stop token may be counted


def test_ignore_eos_reaches_max_tokens(stack, model, http):
    """sglang test/srt/openai_server/validation/test_openai_server_ignore_eos.py::test_ignore_eos:
    with ignore_eos the answer runs to max_tokens and finishes with "length"."""
    _, got = _answer(http, stack.url, chat_body(model, max_tokens=LONG))
    assert got["choices"][0]["finish_reason"] == "length"
    assert got["usage"]["completion_tokens"] == LONG


def test_min_tokens_holds_back_a_stop_token(stack, model, http, greedy_ids):
    """Dynamo's SGLang handler test (min_tokens hold-open) and SGLang's `min_new_tokens`: a stop
    token id generated before min_tokens does not end the answer (in Tokens mode; Text mode
    never sees the ids, `test_stop_token_id_ends_the_answer`)."""
    body = chat_body(model, **PLAIN)
    ids = greedy_ids(body["messages"], LONG)
    _, got = _answer(http, stack.url, {**body, "min_tokens": LONG,
                                       "stop_token_ids": [ids[_fresh_id(ids)]]})
    assert got["usage"]["completion_tokens"] == LONG
    assert got["choices"][0]["finish_reason"] == "length"


def test_penalties_in_range_are_served_and_change_a_repetitive_answer(stack, model, http):
    """sglang test_openai_server.py::test_penalty (frequency_penalty=1.0 gives a text answer);
    here also: the strongest penalties change a greedy answer that repeats tokens."""
    whole, _ = _answer(http, stack.url, chat_body(model, max_tokens=LONG))
    for penalty in ({"frequency_penalty": 1.0}, {"presence_penalty": -1.0},
                    {"repetition_penalty": 1.3}):
        text, got = _answer(http, stack.url, chat_body(model, **penalty))
        assert isinstance(text, str) and got["usage"]["completion_tokens"] == 6, penalty
    strong = {"frequency_penalty": 2.0, "presence_penalty": 2.0, "repetition_penalty": 2.0}
    penalized, _ = _answer(http, stack.url, chat_body(model, max_tokens=LONG, **strong))
    assert penalized != whole


@pytest.mark.parametrize("field, value, words", [
    ("frequency_penalty", 2.5, ["frequency penalty", "-2 and 2", "2.5"]),
    ("presence_penalty", -2.5, ["presence penalty", "-2 and 2", "-2.5"]),
    ("repetition_penalty", 0, ["repetition penalty", "0 and 2", "got 0"]),
    ("repetition_penalty", 2.5, ["repetition penalty", "0 and 2", "2.5"]),
])
def test_penalty_out_of_range_is_the_frontends_400(stack, http, field, value, words):
    """SGLang's sampling_params.verify ranges (penalties in [-2, 2], repetition in (0, 2]),
    which the Dynamo 1.6.1 frontend checks itself before any worker sees the request: its 400
    names the penalty, the range and the value."""
    r = post(http, stack.url, "chat/completions", chat_body("tiny", **{field: value}))
    message = error_body(r)["message"].lower()
    assert all(w in message for w in words), message


def test_same_seed_same_sample_other_seed_other_sample(stack, model, http):
    """sglang test/srt/openai_server/basic/test_protocol.py (seed is honoured) and Dynamo's
    sampling_seed mapping: at temperature 1 the same seed gives the same answer, twice, on
    either model; another seed gives another answer."""
    sampled = chat_body(model, max_tokens=LONG, temperature=1.0)
    first, _ = _answer(http, stack.url, {**sampled, "seed": 7})
    again, _ = _answer(http, stack.url, {**sampled, "seed": 7})
    other, _ = _answer(http, stack.url, {**sampled, "seed": 8})
    assert first == again
    assert first != other
