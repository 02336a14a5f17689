"""A CustomResourceDefinition's structural schema (OpenAPI v3 with Kubernetes' extensions) as a
JSON Schema that `jsonschema` checks the way the API server and `kubectl apply` (field
validation `Strict`, kubectl's default) do:

- an object schema with `properties` rejects fields it does not list (the API server would
  prune or, strictly, refuse them), unless it says `x-kubernetes-preserve-unknown-fields` or is
  an `x-kubernetes-embedded-resource`;
- `x-kubernetes-int-or-string` takes an integer or a string;
- `nullable: true` also takes null.

The other `x-kubernetes-*` keys (list and map types, CEL `x-kubernetes-validations`) are
dropped: they are the operator's and the API server's business, not the manifest's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Keys whose values are maps of field name -> schema, not schemas themselves.
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
# Keys whose values are a schema or a list of schemas.
_SUBSCHEMAS = ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf")


def load_crd(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        # the C loader: a CRD with an embedded pod template is over a megabyte of YAML
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    """The JSON Schema of one served version of the CRD."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version and entry.get("served", False):
            return to_json_schema(entry["schema"]["openAPIV3Schema"])
    raise KeyError(f"{crd['metadata']['name']} serves no version {version!r}")


def to_json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in _SCHEMA_MAPS:
            out[key] = {name: to_json_schema(s) for name, s in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    open_ended = (node.get("x-kubernetes-preserve-unknown-fields")
                  or node.get("x-kubernetes-embedded-resource"))
    if "properties" in node and "additionalProperties" not in node and not open_ended:
        out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out
