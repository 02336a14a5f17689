"""JSON schemas for the structured-output tests, and the check that output obeys one.

The `tiny` model is random, so each schema bounds what it allows (string lengths, integer ranges,
array sizes, enums): a constrained output then ends within a few dozen tokens. The engines run
with at most one whitespace character in a row for the same reason
(`--constrained-json-max-whitespace-cnt 1`, SGLang's flag).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

WHITESPACE_ARGS = ("--constrained-json-max-whitespace-cnt", "1")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
TAGGED = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["color", "tags"],
    "additionalProperties": False,
}
DIGITS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
          "minItems": 1, "maxItems": 4}
NESTED = {
    "type": "object",
    "properties": {"point": {"type": "object",
                             "properties": {"x": {"type": "integer", "minimum": -9,
                                                  "maximum": 9},
                                            "y": {"type": "integer", "minimum": -9,
                                                  "maximum": 9}},
                             "required": ["x", "y"], "additionalProperties": False},
                   "label": {"enum": ["a", "b", None]}},
    "required": ["point", "label"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "tagged": TAGGED, "digits": DIGITS, "nested": NESTED}
BAD_SCHEMA = {"type": "nonsense"}


def assert_valid(text: str, schema: dict[str, Any]) -> Any:
    """`text` parses as JSON and validates against `schema`; -> the value."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise AssertionError(f"not JSON ({exc}): {text!r}") from None
    jsonschema.validate(value, schema)
    return value


def structured_body(schema: dict[str, Any], model: str = "tiny-sglang", **extra) -> dict:
    """A greedy chat request constrained by `schema` through `response_format`."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    return {"model": model, "messages": [{"role": "user", "content": "Reply in JSON."}],
            "max_tokens": 200, "temperature": 0.0, "response_format": fmt, **extra}
