"""Wire types: every validation rule rejects bad input with a message naming the field, and
every type round-trips (pydantic through JSON, msgspec through msgpack)."""

import json

import msgspec
import pytest
from pydantic import BaseModel, ValidationError

from protocol import (
    BootstrapInfo,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    CompletionUsage,
    DisaggPreprocessedRequest,
    PrefillDone,
    PreprocessedRequest,
    PromptTokensDetails,
    ProtocolError,
    TokenDelta,
    describe_validation_error,
    parse,
    to_wire,
)
from protocol.limits import MAX_TOKENS_LIMIT

pytestmark = pytest.mark.timeout(30)

# Exactly what the 1.6.1 frontend sent a Tokens-mode worker, plus an
# unknown future field.
FRONTEND_TOKENS_REQUEST = {
    "model": "tiny",
    "token_ids": [1, 87, 314],
    "stop_conditions": {
        "max_tokens": 3, "stop": None, "stop_token_ids": None, "stop_token_ids_visible": None,
        "stop_token_ids_hidden": [2], "min_tokens": None, "ignore_eos": None,
        "max_thinking_tokens": None,
    },
    "sampling_options": {
        "n": None, "best_of": None, "presence_penalty": None, "frequency_penalty": None,
        "repetition_penalty": None, "temperature": 0.0, "top_p": 0.8999999761581421,
        "top_k": None, "min_p": None, "use_beam_search": None, "length_penalty": None,
        "seed": None, "include_stop_str_in_output": None, "guided_decoding": None,
    },
    "output_options": {
        "logprobs": None, "prompt_logprobs": None, "skip_special_tokens": None,
        "formatted_prompt": None, "return_tokens_as_token_ids": None,
    },
    "eos_token_ids": [2], "mdc_sum": "abc", "annotations": [], "routing": {},
    "router_config_override": None, "some_future_field": {"x": 1},
}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "model": "tiny"}


def _error(model, data) -> str:
    with pytest.raises(ProtocolError) as info:
        parse(model, data)
    return str(info.value)


def test_frontend_tokens_request_parses_and_keeps_unknown_fields():
    req = parse(PreprocessedRequest, FRONTEND_TOKENS_REQUEST)
    assert req.token_ids == [1, 87, 314]
    assert req.stop_conditions.max_tokens == 3
    assert req.stop_conditions.stop_token_ids_hidden == [2]
    assert req.sampling_options.top_p == pytest.approx(0.9)
    assert req.model_extra["some_future_field"] == {"x": 1}
    assert "some_future_field" not in req.wire_dict()  # extras are not forwarded


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"token_ids": [1, -5]}, "token_ids[1]: must be >= 0"),
        ({"token_ids": [1, 2.5]}, "token_ids[1]: must be an integer"),
        ({"token_ids": [True]}, "token_ids[0]: must be an integer"),
        ({"token_ids": []}, "token_ids: must not be empty"),
        ({"token_ids": None}, "token_ids: must be a list"),
        ({"stop_conditions": {"max_tokens": 0}}, "stop_conditions.max_tokens: must be >= 1"),
        (
            {"stop_conditions": {"max_tokens": MAX_TOKENS_LIMIT + 1}},
            f"stop_conditions.max_tokens: must be <= {MAX_TOKENS_LIMIT}",
        ),
        (
            {"sampling_options": {"temperature": -0.1}},
            "sampling_options.temperature: must be >= 0, got -0.1",
        ),
        ({"sampling_options": {"top_p": 0}}, "sampling_options.top_p: must be in (0, 1], got 0.0"),
        ({"sampling_options": {"top_p": 1.5}}, "sampling_options.top_p: must be in (0, 1], "
                                               "got 1.5"),
        ({"sampling_options": {"n": 0}}, "sampling_options.n: must be >= 1"),
    ],
)
def test_tokens_request_rules(patch, message):
    data = {**FRONTEND_TOKENS_REQUEST, **patch}
    if "token_ids" in patch and patch["token_ids"] is None:
        data.pop("token_ids")
        message = "token_ids: is required"
    assert _error(PreprocessedRequest, data) == message


def test_many_bad_ids_give_a_short_message():
    message = _error(PreprocessedRequest, {"token_ids": [-1] * 1000})
    assert message.startswith("token_ids[0]: must be >= 0; token_ids[1]: must be >= 0")
    assert message.endswith("and 997 more problems")


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"messages": []}, "messages: must not be empty"),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "messages[0].role: must be one of 'system', 'user', 'assistant', 'tool' or 'developer'",
        ),
        ({"messages": [{"content": "x"}]}, "messages[0].role: is required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content: part [0] must be {'type': 'text', 'text': ...}",
        ),
        ({"max_tokens": -1}, "max_tokens: must be >= 1"),
        ({"max_completion_tokens": 0}, "max_completion_tokens: must be >= 1"),
        ({"temperature": -1}, "temperature: must be >= 0, got -1.0"),
        ({"top_p": 0.0}, "top_p: must be in (0, 1], got 0.0"),
        ({"n": 0}, "n: must be >= 1"),
        ({"stop": ""}, "stop: stop strings must be non-empty"),
        ({"stop_token_ids": [-3]}, "stop_token_ids[0]: must be >= 0"),
        ({"stream": "maybe"}, "stream: must be a boolean"),
    ],
)
def test_chat_request_rules(patch, message):
    assert _error(ChatCompletionRequest, {**CHAT, **patch}) == message


def test_chat_request_normalizes_and_tolerates():
    req = parse(
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user",
                 "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            "stop": "END",
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False},
            "nvext": {"anything": 1},
        },
    )
    assert req.messages[1].content == "ab"
    assert req.stop == ["END"]
    assert req.completion_limit == 7  # max_completion_tokens wins
    assert req.wants_usage
    assert req.template_messages()[1] == {"role": "user", "content": "ab"}
    assert not parse(ChatCompletionRequest, {**CHAT, "stream": True}).wants_usage
    assert parse(ChatCompletionRequest, CHAT).wants_usage  # non-streaming: always
    assert not req.wants_continuous_usage


@pytest.mark.parametrize("options, stream, expected", [
    ({"include_usage": True, "continuous_usage_stats": True}, True, True),
    ({"continuous_usage_stats": True}, True, False),  # as the frontend: needs include_usage
    ({"include_usage": True, "continuous_usage_stats": True}, False, False),
])
def test_continuous_usage_needs_streaming_and_include_usage(options, stream, expected):
    req = parse(ChatCompletionRequest, {**CHAT, "stream": stream, "stream_options": options})
    assert req.wants_continuous_usage is expected


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"bootstrap_room": 0}, "bootstrap_room: must be >= 1"),
        ({"bootstrap_room": 1 << 63}, f"bootstrap_room: must be <= {(1 << 63) - 1}"),
        ({"bootstrap_port": 0}, "bootstrap_port: must be >= 1"),
        ({"bootstrap_host": ""}, "bootstrap_host: must not be empty"),
        ({"bootstrap_room": "7"}, "bootstrap_room: must be an integer"),
    ],
)
def test_bootstrap_rules(patch, message):
    data = {"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1, **patch}
    assert _error(BootstrapInfo, data) == message


def test_bootstrap_ignores_handoff_bytes():
    boot = parse(BootstrapInfo, {"bootstrap_host": "h", "bootstrap_port": 9, "bootstrap_room": 5,
                                 "handoff_id": b"\xff\x00"})
    assert json.loads(boot.model_dump_json()) == {
        "bootstrap_host": "h", "bootstrap_port": 9, "bootstrap_room": 5,
    }


def test_disagg_request_requires_token_ids():
    msg = _error(DisaggPreprocessedRequest, {"request": {"messages": []}, "sampling_params": {}})
    assert msg == "request.token_ids: is required"
    assert _error(DisaggPreprocessedRequest, {"request": {"token_ids": [1]},
                                              "data_parallel_rank": -1}).startswith(
        "data_parallel_rank: must be >= 0")


def test_not_an_object():
    with pytest.raises(ProtocolError, match="request: must be a JSON object, got str"):
        parse(PreprocessedRequest, "hello")


def test_describe_validation_error_directly():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 0})
    assert describe_validation_error(info.value) == "max_tokens: must be >= 1"


PYDANTIC_SAMPLES: list[BaseModel] = [
    parse(PreprocessedRequest, FRONTEND_TOKENS_REQUEST),
    parse(PreprocessedRequest, {"token_ids": [5], "bootstrap_info": {
        "bootstrap_host": "10.0.0.1", "bootstrap_port": 1234, "bootstrap_room": (1 << 63) - 1}}),
    parse(ChatCompletionRequest, {**CHAT, "stop": ["x"], "stream": True,
                                  "stream_options": {"include_usage": True}, "seed": 7}),
    DisaggPreprocessedRequest(request=PreprocessedRequest(token_ids=[1, 2]),
                              sampling_params={"max_new_tokens": 4}, data_parallel_rank=0),
    BootstrapInfo(bootstrap_host="h", bootstrap_port=1, bootstrap_room=1),
    PrefillDone(prompt_tokens=4, cached_tokens=2),
]


@pytest.mark.parametrize("obj", PYDANTIC_SAMPLES, ids=lambda o: type(o).__name__)
def test_pydantic_json_round_trip(obj):
    again = type(obj).model_validate_json(obj.model_dump_json())
    assert again == obj


USAGE = CompletionUsage(3, 2, 5, PromptTokensDetails(1))
MSGSPEC_SAMPLES = [
    USAGE,
    TokenDelta(token_ids=[4, 5]),
    TokenDelta(token_ids=[6], index=1, finish_reason="length", completion_usage=USAGE),
    ChatCompletionChunk(id="c", created=1, model="m", object="chat.completion.chunk",
                        choices=[ChatChoice(0, ChatDelta(role="assistant", content="hi"), None)]),
    ChatCompletionChunk(id="c", created=1, model="m", object="chat.completion.chunk",
                        choices=[], usage=USAGE),
]


@pytest.mark.parametrize("obj", MSGSPEC_SAMPLES, ids=lambda o: type(o).__name__)
def test_msgspec_round_trips(obj):
    kind = type(obj)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(obj), type=kind) == obj
    assert msgspec.json.decode(msgspec.json.encode(obj), type=kind) == obj
    assert msgspec.convert(json.loads(json.dumps(to_wire(obj))), kind) == obj


def test_wire_shapes():
    assert to_wire(TokenDelta(token_ids=[4])) == {"token_ids": [4]}
    assert to_wire(TokenDelta([6], 0, "stop", CompletionUsage(1, 1, 2))) == {
        "token_ids": [6], "finish_reason": "stop",
        "completion_usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    chunk = to_wire(MSGSPEC_SAMPLES[3])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": "hi"},
                                   "finish_reason": None}
    assert "usage" not in chunk


@pytest.mark.parametrize("host", ["*", "bad host", "0.0.0.0", "::", "[::]", "a..b", "-x.org",
                                  "tcp://10.0.0.1", "h:80", "x" * 254, "ex*mple.com",
                                  "x" * 10_000])
def test_bootstrap_host_must_be_a_dialable_name_or_address(host):
    data = {"bootstrap_host": host, "bootstrap_port": 1, "bootstrap_room": 1}
    for _ in range(2):  # the answer is cached per host: the second time says the same
        assert _error(BootstrapInfo, data).startswith("bootstrap_host: must be a ")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "10.0.0.1", "::1", "[fe80::1]",
                                  "prefill-0.svc.cluster.local", "2.2.2.2"])
def test_bootstrap_host_accepts_names_and_addresses(host):
    assert BootstrapInfo(bootstrap_host=host, bootstrap_port=1, bootstrap_room=1)
