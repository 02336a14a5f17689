"""SGLang's two structural-tag shapes, as its xgrammar backend takes them: the current one
(`{"type": "structural_tag", "format": {...}}`) is compiled as is; the legacy one
(`{"structures": [{"begin", "schema", "end"}], "triggers", "at_least_one"}`), which SGLang's
own tool-call parsers still produce for `tool_choice` required / named, becomes xgrammar's
`triggered_tags` (what `StructuralTag.from_legacy_structural_tag` builds), with the JSON
whitespace settings (`--constrained-json-*`) applied to each tag's arguments as to any JSON
schema. The CPU engine converts what it is sent; the Text-mode worker converts the tool-call
constraint it builds, so `sglang.Engine` bounds the arguments' whitespace the same way."""

from __future__ import annotations

import json


def structural_tag_arg(text: str, any_whitespace: bool = True,
                       max_whitespace_cnt: int | None = None) -> str:
    """What `GrammarCompiler.compile_structural_tag` takes for `text`."""
    tag = json.loads(text)
    if not isinstance(tag, dict) or tag.get("structures") is None:
        return text
    if not any_whitespace:
        max_whitespace_cnt = 0
    tags = [{"type": "tag", "begin": s["begin"], "end": s["end"],
             "content": {"type": "json_schema", "json_schema": s.get("schema") or {},
                         "max_whitespace_cnt": max_whitespace_cnt}}
            for s in tag["structures"]]
    fmt = {"type": "triggered_tags", "triggers": tag.get("triggers") or [], "tags": tags,
           "at_least_one": bool(tag.get("at_least_one", False)), "stop_after_first": False}
    return json.dumps({"type": "structural_tag", "format": fmt})
