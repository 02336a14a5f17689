"""Prompt logprobs: SGLang's test_openai_server.py::run_completion(_stream) with `echo=True,
logprobs=5` (the prompt as a string or token ids, alone or as a list; whole or streamed), on
both models. Tokens mode: Text mode serves no /v1/completions.

The Dynamo 1.6.1 frontend sends `echo` as `output_options.prompt_logprobs` (1) and renders what
the worker returns as `nvext.prompt_logprobs` when the body names it in `nvext.extra_fields`
(`[null, {"<token id>": {"logprob", "rank"?}}, ...]`, one entry per prompt token). It does not
echo the prompt into `text` or `logprobs`: those hold the completion only, so the peer's
`text.startswith(prompt)` is asserted as "the text is the answer without echo", and the prompt's
logprobs are checked in `nvext` against transformers' own forward. On the disaggregated model
the prefill computes them and sends them to the decode (docs/reference/orchestration.md)."""

from __future__ import annotations

import pytest

from tests.e2e.client import completion
from tests.e2e.peer.wire import MAX_TOKENS, chunks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROMPTS = ["The sea is", "Write one line about the sea"]
LOGPROBS = 5
TOL = 1e-3


@pytest.fixture
def tokens_stack(stack):
    if not stack.tokens:
        pytest.skip("Text mode serves chat only (test_text_mode_has_no_completions)")
    return stack


@pytest.fixture(scope="module")
def prompt_logprobs(tiny_model_path):
    """Transformers' log-softmax of the prompt's own next tokens: position i -> token i."""
    import torch

    from tests.e2e.transformers_ref import _model

    model = _model(tiny_model_path)

    def run(ids: list[int]) -> list[float]:
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        return [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    return run


def _body(model: str, prompt, stream: bool) -> dict:
    body = {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "echo": True, "logprobs": LOGPROBS,
            "nvext": {"extra_fields": ["prompt_logprobs"]}}
    return {**body, "stream_options": {"include_usage": True}} if stream else body


def _check_prompt_logprobs(got: list, ids: list[int], want: list[float]) -> None:
    assert len(got) == len(ids) and got[0] is None
    for entry, token, lp in zip(got[1:], ids[1:], want):
        assert abs(entry[str(token)]["logprob"] - lp) < TOL, (token, entry, lp)
        assert all(alt["logprob"] <= 0 for alt in entry.values())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("as_list", [False, True], ids=["one", "list"])
@pytest.mark.parametrize("as_ids", [False, True], ids=["string", "token-ids"])
def test_echo_with_logprobs(tokens_stack, model, http, tokenizer, prompt_logprobs, as_ids,
                            as_list, stream):
    ids = [tokenizer.encode(p) for p in (PROMPTS if as_list else PROMPTS[:1])]
    prompts = ids if as_ids else [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    body = _body(model, prompts if as_list else prompts[0], stream)
    plain = [completion(http, tokens_stack.url, {**_body(model, p, False), "echo": False}
                        )["choices"][0]["text"] for p in prompts]
    if stream:
        _check_streamed(tokens_stack.url, http, body, ids, plain, prompt_logprobs)
    else:
        _check_whole(tokens_stack.url, http, body, ids, plain, prompt_logprobs)


def _check_whole(url, http, body, ids, plain, reference) -> None:
    """run_completion: one choice per prompt, str tokens and dict top_logprobs, exact usage."""
    got = completion(http, url, body)
    assert [c["index"] for c in got["choices"]] == list(range(len(ids)))
    for choice, text in zip(got["choices"], plain):
        assert choice["text"] == text  # the frontend does not echo the prompt
        lp = choice["logprobs"]
        assert isinstance(lp["tokens"][0], str) and isinstance(lp["top_logprobs"][1], dict)
        assert 0 < len(lp["top_logprobs"][1]) <= LOGPROBS
    assert got["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    assert got["usage"]["completion_tokens"] == MAX_TOKENS * len(ids)
    # One nvext per response: a list of prompts shows one prompt's logprobs.
    shown = got["nvext"]["prompt_logprobs"]
    prompt = _prompt_of(shown, ids)
    _check_prompt_logprobs(shown, prompt, reference(prompt))


def _check_streamed(url, http, body, ids, plain, reference) -> None:
    """run_completion_stream: every content chunk has str tokens and dict top_logprobs, every
    index appears, the usage chunk counts; each choice's last chunk has its prompt logprobs."""
    events = chunks(http, url, "completions", body)
    *content, usage = events
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == sum(map(len, ids))
    texts = {i: "" for i in range(len(ids))}
    for event in content:
        [choice] = event["choices"]
        texts[choice["index"]] += choice["text"]
        assert isinstance(choice["logprobs"]["tokens"][0], str)
        assert isinstance(choice["logprobs"]["top_logprobs"][0], dict)
    assert list(texts.values()) == plain
    shown = [e["nvext"]["prompt_logprobs"] for e in content if "prompt_logprobs" in
             (e.get("nvext") or {})]
    assert len(shown) == len(ids)
    assert sorted(map(len, shown)) == sorted(map(len, ids))
    for got in shown:
        prompt = _prompt_of(got, ids)
        _check_prompt_logprobs(got, prompt, reference(prompt))


def _prompt_of(shown: list, ids: list[list[int]]) -> list[int]:
    """The prompt whose tokens these prompt logprobs are about (each position names its own)."""
    [prompt] = [i for i in ids if len(i) == len(shown)
                and all(str(t) in entry for t, entry in zip(i[1:], shown[1:]))]
    return prompt
