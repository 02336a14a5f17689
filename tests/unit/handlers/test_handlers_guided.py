"""Structured-output mapping: Dynamo's `guided_decoding` (Tokens) and the OpenAI body (Text) ->
SGLang's `json_schema` / `regex` / `ebnf` / `structural_tag`, and the 400s for bad shapes."""

import json

import pytest

from handlers.core.errors import RequestError
from handlers.core.guided import guided_decoding_params, text_guided_params

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize("guided, expected", [
    # What Dynamo 1.6.1's own SGLang handler sends for each (its unit tests' cases).
    ({"json": SCHEMA}, {"json_schema": json.dumps(SCHEMA)}),
    ({"regex": "a+"}, {"regex": "a+"}),
    ({"choice": ["yes", "no"]}, {"regex": "(yes|no)"}),
    ({"choice": ["a.b", "c"]}, {"regex": r"(a\.b|c)"}),
    ({"grammar": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
    ({"choice": [None], "grammar": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
    ({"json": SCHEMA, "whitespace_pattern": "[\n ]?"}, {"json_schema": json.dumps(SCHEMA)}),
    ({"regex": "a+", "backend": "xgrammar"}, {"regex": "a+"}),
    (None, {}),
    ({}, {}),
])
def test_tokens_mode_maps_like_dynamos_sglang_handler(guided, expected):
    assert guided_decoding_params(guided) == expected


@pytest.mark.parametrize("body, expected", [
    ({"response_format": {"type": "json_object"}}, {"json_schema": '{"type": "object"}'}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     {"json_schema": json.dumps(SCHEMA)}),
    ({"response_format": {"type": "text"}}, {}),
    ({"guided_json": SCHEMA}, {"json_schema": json.dumps(SCHEMA)}),
    ({"guided_json": json.dumps(SCHEMA)}, {"json_schema": json.dumps(SCHEMA)}),
    ({"guided_regex": "[a-z]+"}, {"regex": "[a-z]+"}),
    ({"guided_choice": ["yes", "no"]}, {"regex": "(yes|no)"}),
    ({"guided_grammar": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
    ({}, {}),
])
def test_text_mode_maps_the_openai_body(body, expected):
    assert text_guided_params(body) == expected


@pytest.mark.parametrize("body, needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema is required"),
    ({"response_format": {"type": "yaml"}}, "response_format.type must be one of"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"},
     "response_format and guided_regex: only one"),
    ({"guided_json": "{not json"}, "guided_json is not valid JSON"),
    ({"guided_json": [1]}, "guided_json must be a JSON schema object"),
    ({"guided_choice": "yes"}, "guided_choice must be a non-empty list of strings"),
    ({"guided_regex": 5}, "guided_regex must be a string"),
])
def test_text_mode_bad_shapes_name_the_field(body, needle):
    with pytest.raises(RequestError, match=needle):
        text_guided_params(body)
