"""Structured output requests -> SGLang's grammar sampling params (`json_schema`, `regex`,
`ebnf`, `structural_tag`), the same on both engines.

Tokens mode: the Dynamo 1.6.1 frontend turns `response_format` (chat) and `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` (chat and completions) into
`sampling_options.guided_decoding` `{"json"|"regex"|"choice"|"grammar"|...}`; it maps
`json_object` to the schema `{"type": "object"}` and refuses a top-level `regex`, `nvext.guided_*`
and `structured_outputs` itself. The mapping is Dynamo's own SGLang handler's
(`_get_guided_decoding_params`): JSON as a dumped schema, a choice as an escaped alternation
regex, a grammar as EBNF. Text mode reads the same fields from the raw OpenAI body; a client
error names its field. Whether a schema, regex or grammar compiles is the engine's call (its
message comes back as a 400).
"""

import json
import re
from typing import Any, Optional

from handlers.core.errors import RequestError

# OpenAI's json_object: a JSON object, as the frontend and SGLang's OpenAI server map it.
JSON_OBJECT_SCHEMA = {"type": "object"}
_TEXT_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def guided_decoding_params(guided: Optional[dict[str, Any]]) -> dict[str, Any]:
    """Tokens mode: Dynamo's `guided_decoding` -> SGLang sampling params (first one set)."""
    if not isinstance(guided, dict):
        return {}
    if guided.get("json") is not None:
        return {"json_schema": _dump("sampling_options.guided_decoding.json", guided["json"])}
    if guided.get("regex") is not None:
        return {"regex": guided["regex"]}
    choices = [str(v) for v in guided.get("choice") or [] if v is not None]
    if choices:
        return {"regex": _alternation(choices)}
    if guided.get("grammar") is not None:
        return {"ebnf": guided["grammar"]}
    if guided.get("structural_tag") is not None:
        return {"structural_tag": _dump("sampling_options.guided_decoding.structural_tag",
                                        guided["structural_tag"])}
    return {}


def text_guided_params(body: dict[str, Any]) -> dict[str, Any]:
    """Text mode: `response_format` or one `guided_*` field of the OpenAI body."""
    given = [f for f in ("response_format", *_TEXT_GUIDED) if _is_set(f, body.get(f))]
    if len(given) > 1:
        raise RequestError(f"{' and '.join(given)}: only one structured-output constraint "
                           "can be set per request")
    if not given:
        return {}
    field, value = given[0], body[given[0]]
    if field == "response_format":
        return _response_format(value)
    if field == "guided_json":
        if isinstance(value, str):  # vLLM accepts the schema as a JSON string too
            value = _parse(field, value)
        return {"json_schema": _dump(field, value)}
    if field == "guided_choice":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RequestError("guided_choice must be a non-empty list of strings")
        return {"regex": _alternation(value)}
    if not isinstance(value, str):
        raise RequestError(f"{field} must be a string, got {type(value).__name__}")
    return {"regex": value} if field == "guided_regex" else {"ebnf": value}


def _response_format(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return {"json_schema": json.dumps(JSON_OBJECT_SCHEMA)}
    if kind != "json_schema":
        raise RequestError("response_format.type must be one of 'text', 'json_object', "
                           f"'json_schema', got {kind!r}")
    spec = value.get("json_schema")
    schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
    if schema is None:
        raise RequestError("response_format.json_schema.schema is required for "
                           "response_format.type 'json_schema'")
    return {"json_schema": _dump("response_format.json_schema.schema", schema)}


def _is_set(field: str, value: Any) -> bool:
    if field == "response_format":
        return value is not None and not (isinstance(value, dict) and value.get("type") == "text")
    return value not in (None, "", [], {})


def _alternation(choices: list[str]) -> str:
    # xgrammar's regex is a full match, so no anchors are needed.
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def _dump(field: str, schema: Any) -> str:
    if not isinstance(schema, (dict, bool)):
        raise RequestError(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    return json.dumps(schema)


def _parse(field: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RequestError(f"{field} is not valid JSON: {exc}") from None
