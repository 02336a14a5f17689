"""SGLang's own prefill/decode disaggregation on CPU (KV over NIXL in DRAM) behind the real
frontend, in Tokens and Text mode: the decode worker's output equals the aggregated CPU engine's,
also on a radix-cache hit in the prefill and streamed, and so do its prompt logprobs and each
of its `n > 1` choices; a cancelled request leaves nothing in either engine; the prefill was warmed up before it served.

One stack per input mode for the module (two SGLang engines start in ~40 s here), on `tiny`.
Tokens mode runs frontend-orchestrated (Dynamo 1.6.1's style: the frontend sends both legs the
room), Text mode decode-orchestrated (the only style for Text mode), so both styles meet the real
SGLang engine without a third stack; the CPU engine's e2e modules run each check in both.
"""

from __future__ import annotations

import pytest

from tests.e2e.choices_checks import by_index, streamed
from tests.e2e.client import chat, error_message, leave_mid_stream, post, stream, user
from tests.e2e.logprobs_checks import check_prompt_logprobs
from tests.support.topologies import (
    AGG, DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED, SGLANG, start_sglang_topology,
)
from harness.topology import wait_until
from tests.support.structured_schemas import SCHEMAS, assert_valid, structured_body

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY = {"temperature": 0.0, "max_tokens": 10, "ignore_eos": True}


ORCHESTRATOR = {"tokens": FRONTEND_ORCHESTRATED, "text": DECODE_ORCHESTRATED}


# Both stacks (both orchestration styles) are in the SGLang core `make test` runs on 0.5.21 too.
@pytest.fixture(scope="module", params=[pytest.param(mode, marks=pytest.mark.sglang_core)
                                        for mode in ("tokens", "text")])
def stack(request, tmp_path_factory, tiny_model_path):
    stack = start_sglang_topology(tmp_path_factory.mktemp(f"sglang-disagg-{request.param}"),
                                  tiny_model_path, skip_tokenizer_init=request.param == "tokens",
                                  disaggregated=True, orchestrator=ORCHESTRATOR[request.param])
    stack.mode = request.param
    yield stack
    stack.stop()


def body(model: str, prompt: str, **extra) -> dict:
    return {"model": model, "messages": user(prompt), **GREEDY, **extra}


def test_prefill_was_warmed_up_before_serving(stack):
    log = stack.procs["prefill"].log_text()
    assert "prefill warmup complete" in log
    assert log.index("prefill warmup complete") < log.index("worker ready")


@pytest.mark.parametrize("prompt", ["hello there", "Tell me about the weather in Paris."])
def test_decode_output_equals_aggregated_also_on_a_prefix_cache_hit(stack, http, prompt):
    ref = chat(http, stack.url, body(AGG, prompt))
    for _ in range(2):  # the second time the prefill finds the prompt in its radix cache
        got = chat(http, stack.url, body(SGLANG, prompt))
        assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
        assert got["usage"]["completion_tokens"] == GREEDY["max_tokens"]
        assert got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]


def test_the_kv_path_was_probed_once_before_the_first_request_used_it(stack, http):
    """One real transfer through SGLang's NIXL path (components/worker/rooms/kv_probe.py) the
    first time this decode used the prefill, and none after."""
    chat(http, stack.url, body(SGLANG, "once more"))
    checked = [ln for ln in stack.procs["sglang"].log_text().splitlines()
               if "KV path from prefill" in ln]
    assert len(checked) == 1 and "checked in" in checked[0], checked


def test_streamed_decode_equals_aggregated(stack, http):
    ref = chat(http, stack.url, body(AGG, "1 2 3 4 5 6 7"))
    got = stream(http, stack.url, "chat/completions", body(SGLANG, "1 2 3 4 5 6 7"))
    assert got.error is None and got.done
    assert got.text == ref["choices"][0]["message"]["content"]
    assert (got.finish_reason, got.usage["completion_tokens"]) == ("length", 10)


# The 1.6.1 frontend refuses n > 1 at temperature 0; top_k=1 samples greedily at any
# temperature, so each choice must equal the greedy aggregated answer whatever SGLang's CPU
# sampler does with the seed. Several prompts: the 1.6.1 frontend used to drop every choice
# after the first finish only when that finish beat the prefill leg's end (leg_end.py).
TOP1_N = {"temperature": 0.7, "top_k": 1, "seed": 7, "max_tokens": 8, "ignore_eos": True,
          "n": 2, "logprobs": True, "top_logprobs": 1}


@pytest.mark.parametrize("n, max_tokens", [(2, 8), (3, 1)])
def test_n_choices_each_equal_greedy_aggregated_whole_and_streamed(stack, http, n, max_tokens):
    for prompt in ("Tell me a story about a ship.", "1 2 3 4 5 6 7", "hello there"):
        ref = chat(http, stack.url, body(AGG, prompt, max_tokens=max_tokens))
        want = ref["choices"][0]["message"]["content"]
        req = {"model": SGLANG, "messages": user(prompt), **TOP1_N, "n": n,
               "max_tokens": max_tokens}
        got = chat(http, stack.url, req)
        choices = by_index(got)
        assert [c["index"] for c in choices] == list(range(n)), got
        assert [c["message"]["content"] for c in choices] == [want] * n, (got, want)
        assert [c["finish_reason"] for c in choices] == ["length"] * n
        assert [len(c["logprobs"]["content"]) for c in choices] == [max_tokens] * n
        assert got["usage"]["completion_tokens"] == n * max_tokens
        assert got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
        s = streamed(http, stack.url, req)
        assert s["text"] == dict.fromkeys(range(n), want), s
        assert s["roles"] == dict.fromkeys(range(n), 1)
        assert s["finishes"] == {i: ["length"] for i in range(n)}
        assert s["usage"]["completion_tokens"] == n * max_tokens


def test_prompt_logprobs_equal_aggregated(stack, http, tokenizer):
    # The SGLang prefill computes them (logprob_start_len=0), the decode's engine cannot; they
    # reach the decode over the room watch. Text mode serves no /v1/completions.
    if stack.mode == "text":
        pytest.skip("prompt logprobs are /v1/completions' echo: Tokens mode only")
    check_prompt_logprobs(http, stack.url, tokenizer, "Once upon a time, the sea", model=SGLANG)


def test_cancel_mid_stream_leaves_nothing_in_either_engine(stack, http):
    b = {**body(SGLANG, "a long answer please"), "max_tokens": 1500, "stream": True}
    assert leave_mid_stream(stack.url, b) >= 3
    for name in ("prefill", "sglang"):
        wait_until(lambda: stack.procs[name].requests_in_flight() == 0, 30,
                   f"the {name} engine's request table to empty")
    assert chat(http, stack.url, body(SGLANG, "next", max_tokens=2))["usage"]["completion_tokens"] == 2


def test_a_request_sglang_refuses_is_a_400_with_its_message(stack, http):
    if stack.mode != "text":
        pytest.skip("Tokens mode: the frontend keeps min_tokens for itself")
    r = post(http, stack.url, "chat/completions",
             {"model": SGLANG, "messages": user("hi"), "max_tokens": 4, "min_tokens": 9})
    assert r.status_code == 400, r.text
    assert "min_new_tokens must be in [0, max_new_tokens(4)], got 9" in error_message(r)
    assert chat(http, stack.url, body(SGLANG, "still alive?", max_tokens=2))["usage"][
        "completion_tokens"] == 2


def test_structured_output_constrains_prefill_and_decode(stack, http):
    """SGLang's prefill samples the first token under the grammar, its decode continues it
    (both modes: in Tokens mode SGLang still loads the tokenizer its grammar backend needs)."""
    for name in ("person", "nested"):
        got = chat(http, stack.url, structured_body(SCHEMAS[name]))
        assert_valid(got["choices"][0]["message"]["content"], SCHEMAS[name])
        assert got["choices"][0]["finish_reason"] == "stop"
