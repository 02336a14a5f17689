"""n > 1 and `stream_options.continuous_usage_stats` through the real frontend, on aggregated
workers in both input modes (one frontend, a Tokens-mode and a Text-mode worker). Disaggregated
n > 1, checked equal to aggregated choice by choice, is in test_e2e_tokens.py (both styles),
test_e2e_text.py and test_e2e_sglang_disagg.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.topology import Stack, wait_until
from tests.e2e.choices_checks import fold_choices
from tests.e2e.client import chat, completion, user
from tests.support.topologies import ENGINE_ARGS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODELS = {"tokens": "tiny-agg-tokens", "text": "tiny-agg-text"}
SEEDED = {"temperature": 0.8, "seed": 11, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path) -> Iterator[Stack]:
    st = Stack(tmp_path_factory.mktemp("choices"), tiny_model_path)
    try:
        st.start_frontend()
        for mode, name in MODELS.items():
            st.start_worker(mode, "null", name, *ENGINE_ARGS, "--endpoint",
                            f"dyn://dynamo.{mode}.generate",
                            skip_tokenizer_init=mode == "tokens")
        st.wait_ready(*MODELS.values())
        yield st
    except BaseException:
        print(st.logs())
        raise
    finally:
        st.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client


def body(mode: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODELS[mode], "messages": user("Tell me about boats."), **SEEDED, **extra}


def events(http: httpx.Client, url: str, req: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with http.stream("POST", f"{url}/v1/chat/completions", json={**req, "stream": True}) as r:
        assert r.status_code == 200, r.read().decode()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
    assert all("error" not in e for e in out), out
    return out


@pytest.mark.parametrize("mode", MODELS)
def test_n3_gives_three_seeded_choices_and_usage_counts_them_all(stack, http, mode):
    out = chat(http, stack.url, body(mode, n=3))
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in choices)
    texts = [c["message"]["content"] for c in choices]
    assert len(set(texts)) > 1, texts  # each choice samples on its own
    assert out["usage"]["completion_tokens"] == 3 * SEEDED["max_tokens"]
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 24
    again = sorted(chat(http, stack.url, body(mode, n=3))["choices"], key=lambda c: c["index"])
    assert [c["message"]["content"] for c in again] == texts  # same seed, same choices


def test_completions_n2_in_tokens_mode(stack, http):
    req = {"model": MODELS["tokens"], "prompt": "Once upon a time", "n": 2, **SEEDED}
    out = completion(http, stack.url, req)
    assert sorted(c["index"] for c in out["choices"]) == [0, 1]
    assert out["usage"]["completion_tokens"] == 2 * SEEDED["max_tokens"]


@pytest.mark.parametrize("mode", MODELS)
def test_n3_stream_has_role_and_finish_once_per_choice(stack, http, mode):
    whole = chat(http, stack.url, body(mode, n=3))["choices"]
    got = events(http, stack.url, body(mode, n=3, stream_options={"include_usage": True}))
    folded = fold_choices(got)
    assert folded["text"] == {c["index"]: c["message"]["content"] for c in whole}
    assert folded["roles"] == {0: 1, 1: 1, 2: 1}
    assert folded["finishes"] == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == 24


@pytest.mark.parametrize("mode", MODELS)
def test_continuous_usage_stats_puts_usage_on_every_chunk(stack, http, mode):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    got = events(http, stack.url, body(mode, stream_options=opts))
    content = [e for e in got if e["choices"]]
    assert len(content) >= 2 and all(e.get("usage") for e in got), got
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == SEEDED["max_tokens"], counts
    prompt = got[-1]["usage"]["prompt_tokens"]
    assert all(e["usage"]["total_tokens"] == prompt + e["usage"]["completion_tokens"]
               for e in got)
    plain = events(http, stack.url, body(mode, stream_options={"include_usage": True}))
    assert [bool(e.get("usage")) for e in plain] == [False] * (len(plain) - 1) + [True]


@pytest.mark.parametrize("opts", [{"continuous_usage_stats": True}, {}])
def test_text_mode_usage_options_match_the_frontends_tokens_mode(stack, http, opts):
    """Where the frontend puts usage in Tokens mode, the Text-mode worker puts it too."""
    def shape(mode: str) -> tuple[bool, bool, bool]:
        got = events(http, stack.url, body(mode, stream_options=opts))
        content = [bool(e.get("usage")) for e in got if e["choices"]]
        return all(content), any(content), not got[-1]["choices"] and bool(got[-1].get("usage"))

    assert shape("text") == shape("tokens")


@pytest.mark.parametrize("mode", MODELS)
def test_cancel_n3_mid_stream_frees_every_choice(stack, mode):
    req = body(mode, n=3, max_tokens=1500, stream=True)
    worker = stack.procs[mode]
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{stack.url}/v1/chat/completions", json=req) as r:
            assert r.status_code == 200, r.read()
            seen, lines = set(), r.iter_lines()  # held: a dropped iterator closes the response
            for line in lines:
                if line.startswith("data:"):
                    seen.update(c["index"] for c in json.loads(line[5:])["choices"])
                if len(seen) == 3:
                    break
            assert worker.kv_pages_in_use() > 0  # still generating
        # leaving the block closed the connection mid-stream
    wait_until(lambda: worker.kv_pages_in_use() == 0, 20,
               "every choice to be aborted and its KV freed")
