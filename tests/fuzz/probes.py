"""Fuzz probes: send a shape, judge the answer, generate random shapes, and a witness
stream that keeps running well-formed requests and must see exactly its solo output.

Knobs (environment): FUZZ_SEED (default 0), FUZZ_SAMPLES (random requests per model in the
sample run, default 30), FUZZ_DURATION_S (if set, random requests run for that long instead).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.e2e.client import StreamResult, stream, user

SEED = int(os.environ.get("FUZZ_SEED", "0"))
SAMPLES = int(os.environ.get("FUZZ_SAMPLES", "30"))
DURATION_S = float(os.environ.get("FUZZ_DURATION_S", "0"))
REQUEST_TIMEOUT_S = 60.0


def send(http: httpx.Client, url: str, path: str, model: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        raw = body.replace(b"{model}", model.encode())
        return http.post(f"{url}/v1/{path}", content=raw,
                         headers={"content-type": "application/json"})
    base: dict[str, Any] = {"model": model, "max_tokens": 4}
    if path == "completions":
        base["prompt"] = "hi"
    else:
        base["messages"] = user("hi")
    return http.post(f"{url}/v1/{path}", json={**base, **body})


def message_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", "")) if isinstance(err, dict) else str(err)


def judge(response: httpx.Response, *, must_reject: bool) -> str:
    """'' when the answer is acceptable, else what is wrong with it."""
    status = response.status_code
    if status >= 500:
        return f"server error {status}: {response.text[:300]}"
    if must_reject and not 400 <= status < 500:
        return f"expected a 4xx, got {status}: {response.text[:300]}"
    if 400 <= status < 500 and not message_of(response).strip():
        return f"{status} without a message"
    return ""


# --- random shapes ----------------------------------------------------------------------------

_NUMBERS = [0, -1, 1, 2, -0.0, 1e-45, 1e-40, 1e-30, 1e-7, 0.5, 1.5, 3.0, 1e38, 1e39, 1e300,
            (1 << 31), (1 << 63), (1 << 64), -(1 << 63), 7.5]
_ODD = [None, True, False, "", "x", "\u202e\u0000\ud7ff", "😀" * 50, [], {}, [1, "a", None],
        {"a": {"b": {"c": [1]}}}]
_FIELDS = ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
           "presence_penalty", "seed", "n", "min_tokens", "stop", "stop_token_ids", "ignore_eos",
           "logprobs", "top_logprobs", "stream", "chat_template_kwargs", "response_format",
           "logit_bias", "skip_special_tokens"]
_TEXTS = ["hi", "", " ", "\u0000", "\ud7ff\ue000", "é" * 300, "🙂" * 200, "a\nb\tc", "<|im_end|>",
          "{{ 7 * 7 }}", "x" * 3000]


def random_body(rng: random.Random) -> dict[str, Any]:
    """A chat body with 1-3 fields set to random, often extreme, values. max_tokens stays
    small, so a valid one finishes fast."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": rng.choice(_TEXTS)}]}
    if rng.random() < 0.2:
        body["messages"] = [{"role": rng.choice(["system", "user", "assistant"]),
                             "content": rng.choice(_TEXTS)} for _ in range(rng.randint(1, 40))]
    for name in rng.sample(_FIELDS, rng.randint(1, 3)):
        pool = _NUMBERS if rng.random() < 0.6 else _ODD
        value = rng.choice(pool)
        if name == "stop" and rng.random() < 0.5:
            value = [rng.choice(_TEXTS)[:20] or "s" for _ in range(rng.randint(1, 40))]
        body[name] = value
    return body


# --- the witness stream -----------------------------------------------------------------------

WITNESS_BODY = {"messages": user("Tell me a story about a lighthouse."), "max_tokens": 48,
                "temperature": 0.0, "ignore_eos": True}


def _solo(url: str, model: str) -> StreamResult:
    # trust_env=False: reading the proxy variables walks os.environ, which pytest changes
    # (PYTEST_CURRENT_TEST) between tests while a witness thread runs (a KeyError killed one).
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as http:
        return stream(http, url, "chat/completions", {"model": model, **WITNESS_BODY})


@dataclass
class Witness:
    """Streams the same greedy request to each model, over and over, one thread per model, so
    every engine has a well-formed stream in flight whenever a fuzz request reaches it."""

    url: str
    models: list[str]
    reference: dict[str, tuple[str, int]] = field(default_factory=dict)
    runs: list[tuple[str, str, int, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(m,), name=f"witness-{m}",
                                          daemon=True) for m in self.models]

    def start(self) -> None:
        for model in self.models:  # alone: nothing else in flight yet
            solo = _solo(self.url, model)
            assert solo.error is None and solo.done, solo
            self.reference[model] = (solo.text, solo.usage["completion_tokens"])
        for thread in self._threads:
            thread.start()

    def _loop(self, model: str) -> None:
        while not self._stop.is_set():
            try:
                got = _solo(self.url, model)
            except (httpx.HTTPError, AssertionError) as exc:
                self.errors.append(f"{model}: {exc!r}")
                continue
            usage = got.usage["completion_tokens"] if got.usage else None
            self.runs.append((model, got.text, usage, got.error))

    def stop(self, timeout: float = 2 * REQUEST_TIMEOUT_S) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), "the witness stream did not finish"

    def mismatches(self) -> list[str]:
        out = list(self.errors)
        for model, text, usage, error in self.runs:
            if (text, usage) != self.reference[model] or error is not None:
                out.append(f"{model}: got {text!r} ({usage} tokens, error {error}), alone it "
                           f"was {self.reference[model]!r}")
        return out


def random_rounds(rng: random.Random):
    """Yields round numbers: SAMPLES rounds, or as many as fit in FUZZ_DURATION_S."""
    if DURATION_S <= 0:
        yield from range(SAMPLES)
        return
    deadline, i = time.monotonic() + DURATION_S, 0
    while time.monotonic() < deadline:
        yield i
        i += 1
