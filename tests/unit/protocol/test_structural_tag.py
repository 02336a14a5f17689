"""SGLang's legacy structural tag (what its tool-call parsers build for a forced tool choice)
as xgrammar's triggered tags, with the JSON whitespace bound; the current shape passes as is."""

import json

from protocol.structural_tag import structural_tag_arg

LEGACY = {"type": "structural_tag", "triggers": ["<tool_call>"], "at_least_one": True,
          "structures": [{"begin": "<tool_call>\n{\"name\":\"f\", \"arguments\":",
                          "schema": {"type": "object"}, "end": "}\n</tool_call>"}]}


def test_legacy_tag_becomes_triggered_tags_with_the_whitespace_bound():
    fmt = json.loads(structural_tag_arg(json.dumps(LEGACY), True, 1))["format"]
    assert fmt["type"] == "triggered_tags" and fmt["at_least_one"] is True
    assert fmt["triggers"] == ["<tool_call>"]
    [tag] = fmt["tags"]
    assert tag["begin"].endswith('"arguments":') and tag["end"] == "}\n</tool_call>"
    assert tag["content"] == {"type": "json_schema", "json_schema": {"type": "object"},
                              "max_whitespace_cnt": 1}


def test_disabling_any_whitespace_means_none_and_a_null_schema_means_any_json():
    legacy = {**LEGACY, "structures": [{**LEGACY["structures"][0], "schema": None}]}
    [tag] = json.loads(structural_tag_arg(json.dumps(legacy), False, 5))["format"]["tags"]
    assert tag["content"]["max_whitespace_cnt"] == 0 and tag["content"]["json_schema"] == {}


def test_the_current_shape_is_passed_as_is():
    text = json.dumps({"type": "structural_tag", "format": {"type": "const_string",
                                                            "value": "x"}})
    assert structural_tag_arg(text, True, 1) == text
