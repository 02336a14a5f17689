"""SGLang on CUDA behind the real frontend, as a Dynamo 1.6.1 user runs it (`make test-gpu`):
aggregated, and disaggregated with the KV over NIXL from VRAM to VRAM (two GPUs, or two engines
sharing one). Greedy output equals transformers' on the same GPU, streamed too, also on the
prefill's prefix-cache hit; a client that leaves frees every engine's requests; a SIGKILLed
prefill makes the next request a clear error, not a hang.

One stack per topology for the module (tests/gpu/stacks.py); the kill test breaks the
disaggregated one and so comes last. Every test skips, saying why, without a CUDA GPU and sglang.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from harness.topology import SGLANG_CPU_PATH, wait_until
from tests.e2e.client import chat, error_message, leave_mid_stream, post, stream, user
from tests.gpu import cuda
from tests.gpu.stacks import MODEL, start_gpu_stack, worker_env

pytestmark = [pytest.mark.gpu, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(cuda.skip_reason() is not None,
                                 reason=cuda.skip_reason() or "")]

PROMPTS = ["hello there", "Tell me about the weather in Paris."]
GREEDY = {"temperature": 0.0, "max_tokens": 16, "ignore_eos": True}
RELEASE_BOUND_S = 30.0  # a left client's requests gone from every engine
ERROR_BOUND_S = 30.0  # a request after the prefill's death answered


@pytest.fixture(scope="module", params=["agg", "disagg"])
def stack(request, tmp_path_factory, small_model_path):
    stack = start_gpu_stack(tmp_path_factory.mktemp(f"gpu-{request.param}"), small_model_path,
                            disaggregated=request.param == "disagg")
    stack.topology = request.param
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def small_tokenizer(small_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(small_model_path)


@pytest.fixture
def http():
    with httpx.Client(timeout=120) as client:
        yield client


def body(prompt: str, **extra) -> dict:
    return {"model": MODEL, "messages": user(prompt), **GREEDY, **extra}


def expected_text(tokenizer, model_path: str, prompt: str) -> tuple[str, int]:
    """transformers' greedy continuation in float32 on this process's first GPU, and the
    prompt's length in tokens (the frontend renders the same chat template)."""
    from tests.e2e.transformers_ref import greedy_ids

    ids = tokenizer.apply_chat_template(user(prompt), add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    out = greedy_ids(model_path, ids, GREEDY["max_tokens"], device="cuda")
    return tokenizer.decode(out, skip_special_tokens=True), len(ids)


def test_workers_run_sglang_on_cuda_without_the_cpu_stand_ins(stack):
    for name, gpu in stack.gpus.items():
        env = worker_env(stack, name)
        assert "SGLANG_USE_CPU_ENGINE" not in env, name
        assert str(SGLANG_CPU_PATH) not in env.get("PYTHONPATH", ""), name
        assert env["CUDA_VISIBLE_DEVICES"] == gpu, name
    if stack.topology == "disagg" and len(cuda.visible_gpus()) > 1:
        assert stack.gpus["prefill"] != stack.gpus["decode"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_equals_transformers_on_the_same_gpu(stack, http, small_tokenizer,
                                                           small_model_path, prompt):
    if not cuda.exact_greedy():
        pytest.skip(f"GPU_TEST_DTYPE={cuda.DTYPE}: exact greedy equality needs float32")
    text, prompt_len = expected_text(small_tokenizer, small_model_path, prompt)
    for _ in range(2):  # the second time the (prefill) engine finds the prompt in its cache
        got = chat(http, stack.url, body(prompt))
        assert got["choices"][0]["message"]["content"] == text
        assert got["choices"][0]["finish_reason"] == "length"
        usage = got["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt_len, 16)


def test_streamed_equals_non_streamed(stack, http):
    whole = chat(http, stack.url, body(PROMPTS[1]))
    streamed = stream(http, stack.url, "chat/completions", body(PROMPTS[1]))
    assert streamed.error is None and streamed.done
    assert streamed.text == whole["choices"][0]["message"]["content"]
    assert (streamed.finish_reason, streamed.usage["completion_tokens"]) == ("length", 16)
    assert len(streamed.arrivals) > 1  # streamed in pieces, not in one


def test_a_client_leaving_mid_stream_frees_every_engines_requests(stack, http):
    b = {**body("a long answer please"), "max_tokens": 1800, "stream": True}
    assert leave_mid_stream(stack.url, b, timeout=120) >= 3
    for name in stack.gpus:
        wait_until(lambda: stack.procs[name].requests_in_flight() == 0, RELEASE_BOUND_S,
                   f"the {name} engine's request table to empty")
    assert chat(http, stack.url, body("next", max_tokens=2))["usage"]["completion_tokens"] == 2


def test_a_killed_prefill_makes_the_next_request_a_clear_error(stack):
    if stack.topology != "disagg":
        pytest.skip("aggregated: there is no prefill worker to kill")
    stack.procs["prefill"].signal_group(signal.SIGKILL)
    stack.procs["prefill"].popen.wait(10)
    with httpx.Client(timeout=ERROR_BOUND_S + 30) as client:
        t0 = time.monotonic()
        r = post(client, stack.url, "chat/completions", body("anyone there?", max_tokens=4))
        elapsed = time.monotonic() - t0
    assert r.status_code >= 500, r.text
    assert error_message(r), r.text  # says what went wrong
    assert elapsed < ERROR_BOUND_S, elapsed
    assert stack.procs["decode"].alive()
    wait_until(lambda: stack.procs["decode"].requests_in_flight() == 0, RELEASE_BOUND_S,
               "the decode engine's request table to empty")
