"""Tool calls and reasoning on the real SGLang engine (SGLang's CPU path) behind the real
frontend, with the OpenAI SDK: Text mode aggregated and disaggregated (decode-orchestrated),
where the worker renders `tools` and parses with SGLang's own parsers; and Tokens mode
aggregated, where the frontend parses with the registered Dynamo parsers.

SGLang 0.5.23 builds no grammar backend with `--skip-tokenizer-init`, so in Tokens mode nothing
can make the random model write a tool call (guided output and a forced tool choice are its
400); there the test checks what the worker registered and that a `tools` request is served.
The CPU engine's module (test_e2e_tools.py) covers Tokens mode's parsing end to end.

One stack for the module: a frontend and four SGLang engines (an engine start costs 20-40 s).
"""

from __future__ import annotations

import json

import openai
import pytest

from harness.topology import Stack
from tests.support.models import model_path
from tests.support.tool_calls import (
    ANSWER, DYN_PARSER_ARGS, NATIVE_PARSER_ARGS, THINK, THINKING_TEXT, TOOLS, args_of,
    assert_enum_call, call_text, collect_stream, forced, reasoning_and_content,
)
from tests.support.topologies import (
    DECODE_ORCHESTRATED, SGLANG, SGLANG_ENGINE_ARGS, start_sglang_decode, start_sglang_prefill,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

AGG = "tiny-sglang-agg"
TOKENS = "tiny-sglang-tokens"
TEXT_MODELS = [SGLANG, AGG]  # disaggregated, aggregated
PARIS = call_text("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = Stack(tmp_path_factory.mktemp("sglang-tools"),
                  str(model_path("tiny", chat_template="qwen3")))
    try:
        stack.start_frontend()
        start_sglang_prefill(stack, "prefill", False, DECODE_ORCHESTRATED, NATIVE_PARSER_ARGS)
        start_sglang_decode(stack, "sglang", False, DECODE_ORCHESTRATED, NATIVE_PARSER_ARGS)
        for name, served, tokens, parsers in (("agg", AGG, False, NATIVE_PARSER_ARGS),
                                              ("tokens", TOKENS, True, DYN_PARSER_ARGS)):
            stack.start_worker(name, "null", served, *SGLANG_ENGINE_ARGS, *parsers,
                               "--endpoint", f"dyn://dynamo.sglang_{name}.generate",
                               skip_tokenizer_init=tokens, engine="sglang")
        stack.wait_ready(SGLANG, AGG, TOKENS)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    yield stack
    stack.stop()


def ask(stack, model: str, stream: bool = False, **body):
    body = {"model": model, "max_tokens": 80, "temperature": 0.0,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}], **body}
    extra = {key: body.pop(key) for key in ("guided_regex",) if key in body}
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="none", timeout=120,
                           max_retries=0)
    return client.chat.completions.create(stream=stream, extra_body=extra, **body)


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_auto_tool_call_is_parsed(stack, model):
    choice = ask(stack, model, tools=TOOLS, **forced(PARIS)).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and args_of(call) == {"city": "Paris"}


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_streamed_tool_call(stack, model):
    got = collect_stream(ask(stack, model, stream=True, tools=TOOLS, **forced(PARIS)))
    assert got["finish"] == "tool_calls", got
    [call] = got["calls"].values()
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_required_and_named_tool_choice(stack, model):
    required = ask(stack, model, tools=TOOLS, tool_choice="required").choices[0]
    assert required.message.tool_calls, required
    assert_enum_call(required.message.tool_calls[0], required.message.tool_calls[0].function.name)
    named = {"type": "function", "function": {"name": "get_time"}}
    [call] = ask(stack, model, tools=TOOLS, tool_choice=named).choices[0].message.tool_calls
    assert_enum_call(call, "get_time")


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_is_split_from_content(stack, model, stream):
    got = ask(stack, model, stream=stream, **forced(THINKING_TEXT))
    reasoning, content = reasoning_and_content(got, stream)
    assert reasoning is not None and reasoning.strip() == THINK
    assert content.strip() == ANSWER


def test_tokens_mode_registers_dynamos_parsers(stack):
    runtime = stack.model_card(TOKENS)["runtime_config"]
    assert (runtime["tool_call_parser"], runtime["reasoning_parser"]) == ("hermes", "qwen3")
    got = ask(stack, TOKENS, max_tokens=8, tools=TOOLS, tool_choice="auto").choices[0]
    assert got.finish_reason in ("stop", "length")


def test_tokens_mode_forced_tool_choice_is_sglangs_400(stack):
    """No grammar backend without a tokenizer in SGLang 0.5.23: a forced choice is refused."""
    with pytest.raises(openai.BadRequestError):
        ask(stack, TOKENS, tools=TOOLS, tool_choice="required")
