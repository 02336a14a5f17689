"""Logprob checks shared by the Tokens- and Text-mode end-to-end tests: what the real frontend
returns (chat `logprobs.content`, completions' legacy `logprobs`), streamed and not, against
`log_softmax` of transformers' logits, and disaggregated against aggregated."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.client import chat, completion, user
from tests.e2e.transformers_ref import greedy_logprobs
from tests.support.topologies import AGG, DISAGG

TOL = 1e-4  # the frontend renders logprobs as float32
TOP = 3
N = 8
BODY = {"temperature": 0.0, "max_tokens": N, "ignore_eos": True}


def sse_events(http: httpx.Client, url: str, path: str, body: dict[str, Any]) -> list[dict]:
    out = []
    with http.stream("POST", f"{url}/v1/{path}", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read().decode()
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
    return out


def chat_entries(http: httpx.Client, url: str, body: dict[str, Any], streaming: bool
                 ) -> list[tuple[str, float, list[float]]]:
    """(token text, logprob, top logprobs) per generated token."""
    if streaming:
        content = [e for ev in sse_events(http, url, "chat/completions", body)
                   for c in ev["choices"] for e in ((c.get("logprobs") or {}).get("content")
                                                     or [])]
    else:
        content = chat(http, url, body)["choices"][0]["logprobs"]["content"]
    return [(e["token"], e["logprob"], [t["logprob"] for t in e["top_logprobs"]])
            for e in content]


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < TOL, (got, want)


def check_chat(http: httpx.Client, url: str, tokenizer: Any, model_path: str,
               prompt: str, model: str = DISAGG) -> None:
    """`model` (streamed and not) == the aggregated CPU engine == transformers' greedy
    logprobs; the CPU engine's disaggregated output is identical to its aggregated output,
    another engine's (SGLang) equal within the tolerance."""
    ids = tokenizer.apply_chat_template(user(prompt), add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    want_ids, want_lps, want_tops = greedy_logprobs(model_path, ids, N, TOP)
    body = {"messages": user(prompt), **BODY, "logprobs": True, "top_logprobs": TOP}
    agg = chat_entries(http, url, {"model": AGG, **body}, streaming=False)
    for streaming in (False, True):
        got = chat_entries(http, url, {"model": model, **body}, streaming)
        if model == DISAGG:
            assert got == agg
        else:
            assert [t for t, _, _ in got] == [t for t, _, _ in agg]
            assert_close([lp for _, lp, _ in got], [lp for _, lp, _ in agg])
            for (_, _, top), (_, _, ref) in zip(got, agg):
                assert_close(top, ref)
    assert [t for t, _, _ in agg] == [tokenizer.decode([i]) for i in want_ids]
    assert_close([lp for _, lp, _ in agg], want_lps)
    for (_, _, top), want in zip(agg, want_tops):
        assert_close(top, [lp for lp, _ in want])


def check_completions(http: httpx.Client, url: str, tokenizer: Any, model_path: str,
                      prompt: str) -> None:
    """/v1/completions' `logprobs: k`, streamed and not, disaggregated == aggregated == ref."""
    ids = tokenizer(prompt)["input_ids"]
    want_ids, want_lps, want_tops = greedy_logprobs(model_path, ids, N, TOP)
    body = {"prompt": prompt, **BODY, "logprobs": TOP}
    whole = completion(http, url, {"model": DISAGG, **body})["choices"][0]["logprobs"]
    ref = completion(http, url, {"model": AGG, **body})["choices"][0]["logprobs"]
    assert whole == ref
    assert whole["tokens"] == [tokenizer.decode([i]) for i in want_ids]
    assert_close(whole["token_logprobs"], want_lps)
    for top, want in zip(whole["top_logprobs"], want_tops):
        assert_close(sorted(top.values(), reverse=True), [lp for lp, _ in want])
    events = sse_events(http, url, "completions", {"model": DISAGG, **body})
    streamed = [lp for ev in events for c in ev["choices"]
                for lp in (c.get("logprobs") or {}).get("token_logprobs", [])]
    assert streamed == whole["token_logprobs"]
