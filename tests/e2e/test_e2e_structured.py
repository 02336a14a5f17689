"""Structured output through the real frontend, both modes, aggregated and disaggregated.

Tokens mode: the 1.6.1 frontend turns `response_format` and `guided_*` into
`sampling_options.guided_decoding`; Text mode: the worker reads the raw body. Either way the
output parses as JSON and validates against the schema, greedy and sampled. Greedy output is the
same disaggregated and aggregated: the prefill engine constrains the first token and the decode
engine's matcher starts after it. A schema or regex that does not compile is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.topology import Stack
from tests.e2e.client import chat, completion, error_message, post, stream, user
from tests.support.shared_stacks import TEXT, TOKENS, StackKey, lease
from tests.support.structured_schemas import BAD_SCHEMA, SCHEMAS, assert_valid
from tests.support.topologies import AGG, DISAGG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODES = ["tokens", "text"]
SAMPLING = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "seed": 11}}


# The shared stacks (tests/support/shared_stacks.py; their keys cap JSON whitespace as these
# tests need): a test's `mode` names its stack (Tokens without one), and the suite runs each
# stack's users together, so a block of this module's tests uses one of them.
KEYS = {"tokens": TOKENS, "text": TEXT}


def _stack_key(params: dict) -> StackKey:
    return KEYS[params.get("mode", "tokens")]


SHARED_STACK = _stack_key


class _Stacks:
    """`stacks[mode]`: the shared stack of `mode`, leased on first use in this block of tests."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._leases: dict[str, Iterator[Stack]] = {}
        self._stacks: dict[str, Stack] = {}

    def __getitem__(self, mode: str) -> Stack:
        if mode not in self._stacks:
            self._leases[mode] = lease(self._request, KEYS[mode])
            self._stacks[mode] = next(self._leases[mode])
        return self._stacks[mode]

    def release(self) -> None:
        for held in self._leases.values():
            next(held, None)  # the lease's release: checked idle, stopped unless next in line


@pytest.fixture(scope="module")
def stacks(request, shared_stacks) -> Iterator[_Stacks]:
    held = _Stacks(request)
    yield held
    held.release()


def schema_body(model: str, name: str, sampling: str, **extra) -> dict:
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}
    return {"model": model, "messages": user("Reply in JSON."), "max_tokens": 200,
            "response_format": fmt, **SAMPLING[sampling], **extra}


def content(response: dict) -> str:
    return response["choices"][0]["message"]["content"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sampling", sorted(SAMPLING))
def test_schema_output_validates_agg_and_disagg(stacks, http, mode, sampling):
    url = stacks[mode].url
    for name, schema in SCHEMAS.items():
        got = {model: chat(http, url, schema_body(model, name, sampling)) for model in
               (DISAGG, AGG)}
        for model, response in got.items():
            assert_valid(content(response), schema)
            assert response["choices"][0]["finish_reason"] == "stop", (model, name)
        if sampling == "greedy":
            assert content(got[DISAGG]) == content(got[AGG]), name


@pytest.mark.parametrize("mode", MODES)
def test_streamed_schema_output_validates(stacks, http, mode):
    got = stream(http, stacks[mode].url, "chat/completions",
                 schema_body(DISAGG, "person", "sampled"))
    assert got.error is None and got.finish_reason == "stop"
    assert_valid(got.text, SCHEMAS["person"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", [DISAGG, AGG])
def test_guided_fields(stacks, http, mode, model):
    url = stacks[mode].url
    base = {"model": model, "messages": user("Pick one."), "max_tokens": 20, "temperature": 1.0,
            "seed": 5}
    choice = content(chat(http, url, {**base, "guided_choice": ["red", "green", "blue"]}))
    assert choice in ("red", "green", "blue")
    regex = content(chat(http, url, {**base, "guided_regex": "[0-9]{3}-[a-z]{2}"}))
    assert len(regex) == 6 and regex[:3].isdigit() and regex[3] == "-" and regex[4:].isalpha()
    ebnf = content(chat(http, url, {**base, "guided_grammar": 'root ::= "ab" [xyz]'}))
    assert ebnf in ("abx", "aby", "abz")
    as_json = content(chat(http, url, {**base, "max_tokens": 200,
                                       "guided_json": SCHEMAS["tagged"]}))
    assert_valid(as_json, SCHEMAS["tagged"])


def test_tokens_mode_completions_guided_json(stacks, http):
    body = {"model": DISAGG, "prompt": "JSON:", "max_tokens": 200, "temperature": 0.0,
            "guided_json": SCHEMAS["digits"]}
    text = completion(http, stacks["tokens"].url, body)["choices"][0]["text"]
    assert_valid(text, SCHEMAS["digits"])


@pytest.mark.parametrize("mode", MODES)
def test_json_object_starts_an_object(stacks, http, mode):
    body = {"model": DISAGG, "messages": user("JSON please"), "max_tokens": 8,
            "temperature": 0.0, "response_format": {"type": "json_object"}}
    assert content(chat(http, stacks[mode].url, body)).lstrip().startswith("{")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", [DISAGG, AGG])
def test_uncompilable_constraint_is_a_400_naming_it(stacks, http, mode, model):
    stack = stacks[mode]
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}
    cases = [({"response_format": bad_schema},
              'Failed to compile json grammar: Unsupported type "nonsense"'),
             ({"guided_regex": "[a-"}, "Failed to compile regex grammar: Regex parsing error")]
    for extra, needle in cases:
        r = post(http, stack.url, "chat/completions",
                 {"model": model, "messages": user("x"), "max_tokens": 5, **extra})
        assert r.status_code == 400 and needle in error_message(r), r.text
    assert all(stack.procs[p].kv_pages_in_use() == 0 for p in ("prefill", "decode", "agg"))


@pytest.mark.parametrize("mode", MODES)
def test_frontend_refuses_top_level_regex(stacks, http, mode):
    # Dynamo 1.6.1's frontend decides this one (SGLang's own server accepts `regex`).
    r = post(http, stacks[mode].url, "chat/completions",
             {"model": DISAGG, "messages": user("x"), "regex": "a+"})
    assert r.status_code == 400, r.text
    assert "Unsupported parameter(s): `regex`" in error_message(r)
