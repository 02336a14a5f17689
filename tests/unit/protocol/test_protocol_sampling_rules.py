"""Sampling parameters are checked where requests enter, as SGLang's SamplingParams.verify()
does, plus fp32: a value the sampler cannot compute in fp32 is a 400 naming the field, in both
modes (Tokens: sampling_options; Text: the OpenAI body)."""

import math

import pytest

from protocol import ChatCompletionRequest, PreprocessedRequest, ProtocolError, parse

pytestmark = pytest.mark.timeout(30)

TOKENS = {"token_ids": [1, 2, 3]}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}

# (field, value, words the message must contain). The first cases were all accepted before.
BAD = [
    ("repetition_penalty", 9.99994610111476e-41, ["repetition_penalty", "fp32"]),  # f32 subnormal
    ("repetition_penalty", 1e-30, ["repetition_penalty", "overflows fp32"]),
    ("repetition_penalty", 2.5, ["repetition_penalty", "2]"]),
    ("temperature", 1e39, ["temperature", "fp32"]),
    ("temperature", math.inf, ["temperature", "finite"]),
    ("temperature", math.nan, ["temperature", "finite"]),
    ("temperature", 1e-40, ["temperature", "too close to 0"]),
    ("temperature", True, ["temperature", "must be a number"]),
    ("temperature", "0.5", ["temperature", "must be a number"]),
    ("top_p", 1e-45, ["top_p", "fp32"]),
    ("min_p", 1.5, ["min_p", "[0, 1]"]),
    ("min_p", -0.1, ["min_p", "[0, 1]"]),
    ("top_k", 0, ["top_k", "-1 (disable) or at least 1"]),
    ("top_k", -5, ["top_k", "-1 (disable) or at least 1"]),
    ("top_k", 1 << 40, ["top_k", str(1 << 30)]),
    ("frequency_penalty", 2.5, ["frequency_penalty", "[-2, 2]"]),
    ("presence_penalty", -3, ["presence_penalty", "[-2, 2]"]),
    ("presence_penalty", 1e300, ["presence_penalty", "fp32"]),
    ("seed", 1 << 64, ["seed", "64-bit"]),
]

GOOD = [
    ("repetition_penalty", 1e-20), ("repetition_penalty", 2.0), ("temperature", 0.0),
    ("temperature", 1e-7), ("temperature", 100.0), ("top_p", 1.0), ("top_k", -1),
    ("top_k", 1 << 30), ("min_p", 0.0), ("frequency_penalty", -2.0), ("seed", -(1 << 63)),
]


def _message(model, data) -> str:
    with pytest.raises(ProtocolError) as info:
        parse(model, data)
    return str(info.value)


@pytest.mark.parametrize("field, value, words", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_tokens_mode_rejects_with_the_field_named(field, value, words):
    message = _message(PreprocessedRequest, {**TOKENS, "sampling_options": {field: value}})
    assert message.startswith(f"sampling_options.{field}: "), message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("field, value, words", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_text_mode_rejects_with_the_field_named(field, value, words):
    message = _message(ChatCompletionRequest, {**CHAT, field: value})
    assert message.startswith(f"{field}: "), message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("field, value", GOOD)
def test_values_sglang_accepts_and_fp32_computes_pass(field, value):
    assert getattr(parse(PreprocessedRequest, {**TOKENS, "sampling_options": {field: value}})
                   .sampling_options, field) == value
    assert getattr(parse(ChatCompletionRequest, {**CHAT, field: value}), field) == value


def test_floor_keeps_the_penalised_logit_finite_in_fp32():
    """The reason for the repetition_penalty floor, checked in fp32 arithmetic."""
    torch = pytest.importorskip("torch")
    from protocol.sampling_rules import MIN_REPETITION_PENALTY

    logits = torch.tensor([1e6, -1e6, 3.0], dtype=torch.float32)
    out = logits / MIN_REPETITION_PENALTY / 1e-6
    assert torch.isfinite(out).all()
    assert torch.isfinite(torch.softmax(out, dim=-1)).all()
    poisoned = logits / torch.tensor(9.99994610111476e-41, dtype=torch.float32)
    assert not torch.isfinite(torch.softmax(poisoned, dim=-1)).all()
