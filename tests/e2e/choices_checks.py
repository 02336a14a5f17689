"""`n > 1` checks shared by the disaggregated e2e modules: a disaggregated model's choices equal
a reference model's for the same request, whole and streamed, each choice with its own role,
finish reason and logprobs, and usage counting every choice."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.client import chat

# The 1.6.1 frontend refuses n > 1 at temperature 0 in both modes ("to ensure diverse
# outputs"): greedy choices are checked at the engine (tests/unit/engine/
# test_engine_disagg_choices.py); here a narrow top-k stands in.
TOP_K_N = {"temperature": 0.5, "top_k": 2, "seed": 5, "max_tokens": 8, "ignore_eos": True,
           "n": 2}
SEEDED_N = {"temperature": 0.8, "seed": 11, "max_tokens": 8, "ignore_eos": True, "n": 3,
            "logprobs": True, "top_logprobs": 2}


def by_index(out: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(out["choices"], key=lambda c: c["index"])


def streamed(http: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The SSE stream of `body` folded per choice (`fold_choices`)."""
    events = []
    req = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", f"{url}/v1/chat/completions", json=req) as r:
        assert r.status_code == 200, r.read().decode()
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            assert "error" not in event, event
            events.append(event)
    return fold_choices(events)


def fold_choices(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Streamed chat events per choice: text, roles and finish reasons by index, and the last
    usage."""
    text: dict[int, str] = {}
    roles: dict[int, int] = {}
    finishes: dict[int, list[str]] = {}
    usage = None
    for event in events:
        usage = event.get("usage") or usage
        for c in event["choices"]:
            i = c["index"]
            text[i] = text.get(i, "") + (c["delta"].get("content") or "")
            roles[i] = roles.get(i, 0) + (c["delta"].get("role") == "assistant")
            if c.get("finish_reason"):
                finishes.setdefault(i, []).append(c["finish_reason"])
    return {"text": text, "roles": roles, "finishes": finishes, "usage": usage}


def assert_choices_equal(http: httpx.Client, url: str, model: str, reference: str,
                         body: dict[str, Any]) -> list[str]:
    """`model` answers `body` (with `n`) exactly as `reference` does, choice by choice; ->
    the choices' texts."""
    n, max_tokens = body["n"], body["max_tokens"]
    got = chat(http, url, {"model": model, **body})
    ref = chat(http, url, {"model": reference, **body})
    texts = [c["message"]["content"] for c in by_index(got)]
    assert [c["index"] for c in by_index(got)] == list(range(n)), got
    assert texts == [c["message"]["content"] for c in by_index(ref)], (got, ref)
    assert all(c["finish_reason"] == "length" for c in got["choices"])
    if body.get("logprobs"):
        assert ([c["logprobs"] for c in by_index(got)]
                == [c["logprobs"] for c in by_index(ref)])
    assert got["usage"]["completion_tokens"] == n * max_tokens
    assert got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
    s = streamed(http, url, {"model": model, **body})
    assert s["text"] == dict(enumerate(texts)), (s, texts)
    assert s["roles"] == {i: 1 for i in range(n)}
    assert s["finishes"] == {i: ["length"] for i in range(n)}
    assert s["usage"]["completion_tokens"] == n * max_tokens
    return texts
