"""SGLang's own tool-call and reasoning parsers behind the handlers' ChatParsers, on the
`qwen3`-template model's tokenizer: the same text parsed streamed (in any chunking) and whole,
the forced tool choice's constraint, and the names checked at startup."""

import json

import pytest
import xgrammar as xgr

from components.backends.sglang_parsers import SglangChatParsers, check_parser_names
from tests.support.models import model_path
from tests.support.tool_calls import TOOLS, call_text

pytestmark = pytest.mark.timeout(120)

TEXT = "<think>\nCheck it.\n</think>\n\n" + call_text("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path("tiny", chat_template="qwen3"))


@pytest.fixture(scope="module")
def parsers(tok):
    return SglangChatParsers("qwen25", "qwen3", tok,
                             whitespace={"any_whitespace": True, "max_whitespace_cnt": 1})


def _streamed(parse, text: str, size: int):
    out = [parse.feed(text[i:i + size]) for i in range(0, len(text), size)] + [parse.finish()]
    calls: dict[int, dict] = {}
    for got in out:
        for call in got.calls:
            entry = calls.setdefault(call.index, {"name": call.name, "arguments": ""})
            entry["arguments"] += call.arguments
    return "".join(o.reasoning for o in out), "".join(o.content for o in out), calls


@pytest.mark.parametrize("size", [1, 3, 7, len(TEXT)])
def test_streamed_parse_matches_the_whole_parse(parsers, size):
    whole = parsers.start(TOOLS, "auto", {}).parse_all(TEXT)
    reasoning, content, calls = _streamed(parsers.start(TOOLS, "auto", {}), TEXT, size)
    assert whole.reasoning.strip() == reasoning.strip() == "Check it."
    assert not whole.content.strip() and not content.strip()
    [call] = whole.calls
    assert call.name == calls[0]["name"] == "get_weather"
    assert json.loads(call.arguments) == json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_enable_thinking_false_reads_an_untagged_answer_as_content(parsers):
    assert parsers.start(None, "auto", {"enable_thinking": False}).parse_all("Hi.").content == "Hi."
    default = parsers.start(None, "auto", {}).parse_all("Hi.")
    assert (default.reasoning, default.content) == ("Hi.", "")


def test_required_constraint_is_a_triggered_tag_with_bounded_whitespace(parsers, tok):
    kind, text = parsers.tool_constraint(TOOLS, "required", True)
    tag = json.loads(text)
    assert kind == "structural_tag" and tag["format"]["type"] == "triggered_tags"
    assert tag["format"]["at_least_one"] is True
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    grammar = xgr.GrammarCompiler(info).compile_structural_tag(text)
    ok = '<tool_call>\n{"name":"get_weather", "arguments":{"city": "Rome"}}\n</tool_call>'
    assert xgr.GrammarMatcher(grammar).accept_string(ok)
    assert not xgr.GrammarMatcher(grammar).accept_string("free text")
    assert not xgr.GrammarMatcher(grammar).accept_string(ok.replace("Rome", "Oslo"))


def test_a_malformed_tool_is_a_value_error(parsers):
    with pytest.raises(ValueError):
        parsers.start([{"type": "function", "function": {"parameters": {}}}], "auto", {})


def test_names_are_checked_against_sglangs():
    check_parser_names("qwen25", "qwen3")
    with pytest.raises(SystemExit, match="--reasoning-parser 'x' is not one of SGLang's"):
        check_parser_names(None, "x")


def test_two_calls_in_one_chunk_both_arrive_whole(parsers):
    """Chunks coalesce when the reader lags: every call in one is streamed, arguments too."""
    text = call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("get_time",
                                                                          {"zone": "UTC"})
    _, _, calls = _streamed(parsers.start(TOOLS, "auto", {"enable_thinking": False}), text,
                            len(text))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})]
