"""Tool calls and reasoning on the real SGLang engine (SGLang's CPU path) behind the real
frontend, with the OpenAI SDK, in both modes, aggregated and disaggregated:
- Text mode (the worker renders `tools` and parses with SGLang's own parsers): aggregated, and
  disaggregated in the decode-orchestrated style;
- Tokens mode (the frontend parses with the registered Dynamo parsers): aggregated, and
  disaggregated in the frontend-orchestrated style (the topology Dynamo deploys).
What the random model writes is forced with structured output (tests/support/tool_calls.py);
in Tokens mode SGLang keeps its tokenizer for that (components/backends/sglang_engine.py).

One stack per topology, one at a time (an engine start costs 20-40 s, and an idle SGLang prefill or
decode engine polls at up to a core on its CPU path, starving the others on two cores).
"""

from __future__ import annotations

import json

import openai
import pytest

from harness.topology import Stack, free_port
from tests.support.models import model_path
from tests.support.tool_calls import (
    ANSWER, DYN_PARSER_ARGS, NATIVE_PARSER_ARGS, THINK, THINKING_TEXT, TOOLS, args_of,
    assert_enum_call, call_text, collect_stream, forced, reasoning_and_content,
)
from tests.support.topologies import (
    DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED, SGLANG, SGLANG_ENGINE_ARGS,
    start_sglang_decode,
    start_sglang_prefill,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

START_TIMEOUT_S = 240  # at most two engines starting together on two cores

AGG = "tiny-sglang-agg"
TOKENS = "tiny-sglang-tokens"
TOKENS_DISAGG = "tiny-sglang-tokens-disagg"
MODELS = [SGLANG, AGG, TOKENS, TOKENS_DISAGG]  # Text disagg, Text agg, Tokens agg, Tokens disagg
PARIS = call_text("get_weather", {"city": "Paris"})


def start_text_disagg(stack: Stack) -> None:
    start_sglang_prefill(stack, "prefill", False, DECODE_ORCHESTRATED, NATIVE_PARSER_ARGS)
    start_sglang_decode(stack, "sglang", False, DECODE_ORCHESTRATED, NATIVE_PARSER_ARGS)


def start_agg(served: str, tokens: bool, parsers: tuple[str, ...]):
    def start(stack: Stack) -> None:
        stack.start_worker("agg", "null", served, *SGLANG_ENGINE_ARGS, *parsers,
                           "--endpoint", "dyn://dynamo.sglang_agg.generate",
                           skip_tokenizer_init=tokens, engine="sglang")
    return start


def start_tokens_disagg(stack: Stack) -> None:
    """A frontend-orchestrated prefill and decode pair in Tokens mode, serving TOKENS_DISAGG."""
    for name, mode in (("tprefill", "prefill"), ("tdecode", "decode")):
        port = ("--disaggregation-bootstrap-port", str(free_port())) if mode == "prefill" else ()
        stack.start_worker(name, mode, TOKENS_DISAGG, *SGLANG_ENGINE_ARGS, *DYN_PARSER_ARGS,
                           "--disaggregation-transfer-backend", "nixl",
                           "--disagg-orchestrator", FRONTEND_ORCHESTRATED, *port,
                           "--endpoint", f"dyn://dynamo.sglang_{name}.generate",
                           skip_tokenizer_init=True, engine="sglang")


TOPOLOGIES = {SGLANG: start_text_disagg, AGG: start_agg(AGG, False, NATIVE_PARSER_ARGS),
              TOKENS: start_agg(TOKENS, True, DYN_PARSER_ARGS), TOKENS_DISAGG: start_tokens_disagg}


@pytest.fixture(scope="module", params=MODELS)
def stack(request, tmp_path_factory):
    """The served model's topology alone behind a frontend; the previous one is stopped first."""
    model = request.param
    stack = Stack(tmp_path_factory.mktemp(f"sglang-tools-{model}"),
                  str(model_path("tiny", chat_template="qwen3")))
    try:
        stack.start_frontend()
        TOPOLOGIES[model](stack)
        # Frontend-orchestrated, the decode is listed before its prefill is registered.
        stack.wait_ready(model, timeout=START_TIMEOUT_S, probe=model == TOKENS_DISAGG)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    stack.model = model
    yield stack
    stack.stop()


def ask(stack, model: str, stream: bool = False, **body):
    body = {"model": model, "max_tokens": 80, "temperature": 0.0,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}], **body}
    extra = {key: body.pop(key) for key in ("guided_regex",) if key in body}
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="none", timeout=120,
                           max_retries=0)
    return client.chat.completions.create(stream=stream, extra_body=extra, **body)


def test_auto_tool_call_is_parsed(stack):
    choice = ask(stack, stack.model, tools=TOOLS, **forced(PARIS)).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and args_of(call) == {"city": "Paris"}


def test_streamed_tool_call(stack):
    got = collect_stream(ask(stack, stack.model, stream=True, tools=TOOLS, **forced(PARIS)))
    assert got["finish"] == "tool_calls", got
    [call] = got["calls"].values()
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


def test_required_and_named_tool_choice(stack):
    model = stack.model
    required = ask(stack, model, tools=TOOLS, tool_choice="required").choices[0]
    assert required.message.tool_calls, required
    assert_enum_call(required.message.tool_calls[0], required.message.tool_calls[0].function.name)
    named = {"type": "function", "function": {"name": "get_time"}}
    [call] = ask(stack, model, tools=TOOLS, tool_choice=named).choices[0].message.tool_calls
    assert_enum_call(call, "get_time")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_is_split_from_content(stack, stream):
    got = ask(stack, stack.model, stream=stream, **forced(THINKING_TEXT))
    reasoning, content = reasoning_and_content(got, stream)
    assert reasoning is not None and reasoning.strip() == THINK
    assert content.strip() == ANSWER


@pytest.mark.parametrize("stack", [TOKENS, TOKENS_DISAGG], indirect=True)
def test_tokens_mode_registers_dynamos_parsers(stack):
    runtime = stack.model_card(stack.model)["runtime_config"]
    assert (runtime["tool_call_parser"], runtime["reasoning_parser"]) == ("hermes", "qwen3")
