"""Structured output in the CPU engine: the xgrammar layer (compile, cache, bounded wait,
errors) and constrained generation through `CpuEngine` (schema-valid output, greedy and sampled,
the finish reason, KV freed)."""

import asyncio
import json
import threading

import pytest

from components.engine.process.engine import CpuEngine
from components.engine.output.grammar import GrammarBackend
from components.engine.output.sampling_params import SamplingParams
from tests.support.structured_schemas import BAD_SCHEMA, SCHEMAS, assert_valid

TINY_EOS = frozenset({2})


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = CpuEngine(model_path=tiny_model_path, max_total_tokens=8192,
                    constrained_json_max_whitespace_cnt=1)
    yield eng
    eng.shutdown()


@pytest.fixture
def backend(tiny_model_path):
    b = GrammarBackend(tiny_model_path, 2048, TINY_EOS)
    yield b
    b.shutdown()


@pytest.mark.parametrize("kind, text, message", [
    ("json_schema", json.dumps(BAD_SCHEMA), 'Unsupported type "nonsense"'),
    ("json_schema", "{not json", "Expecting property name"),
    ("regex", "[a-", "Unclosed '['"),
    ("ebnf", "root ::= missing", 'Rule "missing" is not defined'),
])
async def test_compile_error_names_the_problem(backend, kind, text, message):
    with pytest.raises(ValueError) as info:
        await backend.request_grammar(kind, text)
    key = "json" if kind == "json_schema" else kind  # SGLang's key names
    assert str(info.value).startswith(f"Failed to compile {key} grammar: ")
    assert message in str(info.value)
    assert "/project/cpp" not in str(info.value)  # xgrammar's source location is stripped


async def test_compiled_once_per_schema(backend):
    first = await backend.request_grammar("regex", "(yes|no)")
    second = await backend.request_grammar("regex", "(yes|no)")
    assert backend.compiles == 1
    assert first.matcher is not second.matcher  # each request advances its own matcher


async def test_compile_wait_is_bounded(tiny_model_path, monkeypatch):
    backend = GrammarBackend(tiny_model_path, 2048, TINY_EOS, compile_timeout_s=0.2)
    release = threading.Event()
    # A compile that hangs, patched in privately: no real grammar is reliably slow enough.
    monkeypatch.setattr(backend, "_compile", lambda k, t: release.wait(10))
    try:
        with pytest.raises(ValueError, match="did not finish within"):
            await backend.request_grammar("regex", "a+")
    finally:
        release.set()
        backend.shutdown()


def test_sampling_params_take_one_grammar():
    sp = SamplingParams.from_dict({"json_schema": '{"type": "object"}', "regex": ""}, 100)
    assert (sp.json_schema, sp.regex) == ('{"type": "object"}', None)
    with pytest.raises(ValueError, match="Only one of json_schema, regex, ebnf"):
        SamplingParams.from_dict({"json_schema": "{}", "regex": "a"}, 100)
    with pytest.raises(ValueError, match="regex must be a string"):
        SamplingParams.from_dict({"regex": 5}, 100)


def _schema_params(name: str, sampled: bool) -> dict:
    params = {"json_schema": json.dumps(SCHEMAS[name]), "max_new_tokens": 200}
    return {**params, "temperature": 1.0, "sampling_seed": 7} if sampled else {
        **params, "temperature": 0.0}


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_constrained_output_validates(engine, name, sampled):
    out = await engine.async_generate(prompt="Reply in JSON.",
                                      sampling_params=_schema_params(name, sampled))
    assert_valid(out["text"], SCHEMAS[name])
    # The grammar ends the request on the model's EOS, as SGLang's does (FINISH_MATCHED_TOKEN).
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "stop" and reason["matched"] in engine.eos_token_ids
    assert engine.kv_pages_in_use() == 0


async def test_regex_choice_and_ebnf(engine):
    choice = await engine.async_generate(
        prompt="yes or no?", sampling_params={"regex": "(yes|no|maybe)", "temperature": 0.0})
    assert choice["text"] in ("yes", "no", "maybe")
    ebnf = await engine.async_generate(
        prompt="x", sampling_params={"ebnf": 'root ::= "a" [0-9] "b"', "temperature": 1.0,
                                     "sampling_seed": 3})
    assert len(ebnf["text"]) == 3 and ebnf["text"][0] == "a" and ebnf["text"][2] == "b"


async def test_constrained_and_free_rows_share_a_batch(engine):
    free = {"temperature": 0.0, "max_new_tokens": 30, "ignore_eos": True}
    alone = await engine.async_generate(prompt="free text", sampling_params=free)
    outs = await asyncio.gather(
        engine.async_generate(prompt="free text", sampling_params=free),
        *(engine.async_generate(prompt="Reply in JSON.", sampling_params=_schema_params(n, True))
          for n in sorted(SCHEMAS)))
    assert outs[0]["output_ids"] == alone["output_ids"]  # the mask touched constrained rows only
    for name, out in zip(sorted(SCHEMAS), outs[1:]):
        assert_valid(out["text"], SCHEMAS[name])


async def test_bad_grammar_is_refused_before_it_runs(engine):
    with pytest.raises(ValueError, match='Failed to compile json grammar: Unsupported type'):
        await engine.async_generate(prompt="x",
                                    sampling_params={"json_schema": json.dumps(BAD_SCHEMA)})
    stream = await engine.async_generate(prompt="x", sampling_params={"regex": "(a"},
                                         stream=True)
    with pytest.raises(ValueError, match="Failed to compile regex grammar"):
        await stream.__anext__()
    assert engine.kv_pages_in_use() == 0
