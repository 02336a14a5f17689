"""Logprob checks shared by the Tokens- and Text-mode end-to-end tests: what the real frontend
returns (chat `logprobs.content`, completions' legacy `logprobs`), streamed and not, against
`log_softmax` of transformers' logits, and disaggregated against aggregated."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.client import chat, completion, user
from tests.e2e.transformers_ref import greedy_logprobs, prompt_logprobs
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


# Prompt logprobs on /v1/completions and the alternatives each position gets: `echo` (the 1.6.1
# frontend sends it as prompt_logprobs 1) and the body's `prompt_logprobs: k`; the frontend shows
# them only under `nvext` when named.
PROMPT_ASKS = (({"echo": True, "logprobs": TOP}, 1), ({"prompt_logprobs": TOP}, TOP))
SHOW = {"nvext": {"extra_fields": ["prompt_logprobs"]}}


def shown_prompt_logprobs(http: httpx.Client, url: str, body: dict[str, Any],
                          streaming: bool) -> list:
    """`nvext.prompt_logprobs` of a one-prompt completion (streamed: on its last chunk)."""
    if not streaming:
        return completion(http, url, {**body, **SHOW})["nvext"]["prompt_logprobs"]
    events = sse_events(http, url, "completions", {**body, **SHOW})
    [shown] = [e["nvext"]["prompt_logprobs"] for e in events
               if "prompt_logprobs" in (e.get("nvext") or {})]
    return shown


def check_prompt_logprobs(http: httpx.Client, url: str, tokenizer: Any, prompt: str,
                          model: str = DISAGG) -> None:
    """`model`'s prompt logprobs, streamed and not, == the aggregated CPU engine's: identical
    for the CPU engine's disaggregated model, within the tolerance for another engine's."""
    ids = tokenizer(prompt)["input_ids"]
    for ask, _ in PROMPT_ASKS:
        body = {"prompt": prompt, **BODY, **ask}
        ref = shown_prompt_logprobs(http, url, {"model": AGG, **body}, streaming=False)
        assert len(ref) == len(ids) and ref[0] is None
        assert all(str(t) in pos for t, pos in zip(ids[1:], ref[1:]))
        for streaming in (False, True):
            got = shown_prompt_logprobs(http, url, {"model": model, **body}, streaming)
            if model == DISAGG:
                assert got == ref, (ask, streaming)
                continue
            assert len(got) == len(ref) and got[0] is None
            for mine, want in zip(got[1:], ref[1:]):
                assert mine.keys() == want.keys(), (mine, want)
                assert_close([mine[k]["logprob"] for k in mine], [want[k]["logprob"] for k in mine])


def check_prompt_logprobs_vs_transformers(http: httpx.Client, url: str, tokenizer: Any,
                                          model_path: str, prompt: str, model: str) -> None:
    """`model`'s prompt logprobs, streamed and not, == transformers' forward (for a stack with
    no aggregated reference; the aggregated CPU engine equals it within the same bound)."""
    ids = tokenizer(prompt)["input_ids"]
    want = prompt_logprobs(model_path, ids)
    for ask, top in PROMPT_ASKS:
        for streaming in (False, True):
            got = shown_prompt_logprobs(http, url, {"model": model, "prompt": prompt, **BODY,
                                                    **ask}, streaming)
            assert len(got) == len(ids) and got[0] is None
            assert_close([pos[str(t)]["logprob"] for t, pos in zip(ids[1:], got[1:])], want)
            assert all(sorted(p["rank"] for p in pos.values() if "rank" in p)
                       == list(range(1, top + 1)) for pos in got[1:]), (ask, got)
