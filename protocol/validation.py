"""Turn pydantic validation errors into one short message a client can act on (HTTP 400)."""

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

# How many problems one message lists; pydantic reports every bad element of a list,
# and a 250k-token prompt with many bad ids must not produce a 250k-line error.
_MAX_LISTED = 3


class ProtocolError(ValueError):
    """A request failed wire validation; str(self) names the field and the problem."""


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "request"


def _number(value: Any) -> Any:
    """1.0 -> 1 so bounds read as written in the rules ("must be >= 0")."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _problem(err: dict[str, Any]) -> str:
    kind, ctx = err.get("type", ""), {k: _number(v) for k, v in (err.get("ctx") or {}).items()}
    simple = {
        "greater_than_equal": "must be >= {ge}",
        "greater_than": "must be > {gt}",
        "less_than_equal": "must be <= {le}",
        "less_than": "must be < {lt}",
        "missing": "is required",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "int_from_float": "must be an integer",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "bool_type": "must be a boolean",
        "bool_parsing": "must be a boolean",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
    }
    if kind in simple:
        return simple[kind].format(**ctx)
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return "must not be empty"
        return f"must have at least {ctx.get('min_length')} items"
    if kind == "string_too_short":
        if ctx.get("min_length") == 1:
            return "must not be empty"
        return f"must have at least {ctx.get('min_length')} characters"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "")))
    return str(err.get("msg", "is invalid"))


def describe_validation_error(exc: ValidationError) -> str:
    """'max_tokens: must be >= 1' (up to three problems, '; '-joined, then a count)."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{_location(e['loc'])}: {_problem(e)}" for e in errors[:_MAX_LISTED]]
    if len(errors) > _MAX_LISTED:
        parts.append(f"and {len(errors) - _MAX_LISTED} more problems")
    return "; ".join(parts)


def parse(model: type[ModelT], data: Any) -> ModelT:
    """Validate `data` (a dict off the wire) as `model`; bad input raises ProtocolError."""
    if isinstance(data, model):
        return data
    if not isinstance(data, dict):
        raise ProtocolError(f"request: must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(describe_validation_error(exc)) from None
