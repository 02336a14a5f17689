"""Small OpenAI-over-HTTP helpers for the end-to-end tests (httpx, SSE parsing)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx


@dataclass
class StreamResult:
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    roles: list[str] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each content delta
    done: bool = False


def user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def post(http: httpx.Client, url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(f"{url}/v1/{path}", json=body)


def chat(http: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(http, url, "chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def completion(http: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(http, url, "completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def apply_event(result: StreamResult, data: dict[str, Any]) -> None:
    if "error" in data:
        result.error = data["error"]
        return
    if data.get("usage"):
        result.usage = data["usage"]
    for choice in data.get("choices", []):
        delta = choice.get("delta") or {}
        if delta.get("role"):
            result.roles.append(delta["role"])
        piece = delta.get("content") if "delta" in choice else choice.get("text")
        if piece:
            result.text += piece
            result.arrivals.append(time.monotonic())
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


def stream(http: httpx.Client, url: str, path: str, body: dict[str, Any],
           on_first: Callable[[], Any] | None = None, retry_503_s: float = 0.0) -> StreamResult:
    """POST with stream=true (usage requested) and collect the SSE events; `on_first` is
    called at the first one. A 503 is sent again for `retry_503_s` seconds (a frontend whose
    round robin still lists a killed worker answers it at once)."""
    result = StreamResult()
    body = {"stream_options": {"include_usage": True}, **body, "stream": True}
    deadline = time.monotonic() + retry_503_s
    while True:
        with http.stream("POST", f"{url}/v1/{path}", json=body) as r:
            if r.status_code != 503 or time.monotonic() >= deadline:
                assert r.status_code == 200, r.read().decode()
                return _collect(r, result, on_first)
        time.sleep(0.2)  # the pace of the retries, not a wait for anything


def _collect(r: httpx.Response, result: StreamResult,
             on_first: Callable[[], Any] | None) -> StreamResult:
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        if on_first is not None:
            on_first()
            on_first = None
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            result.done = True
            break
        apply_event(result, json.loads(payload))
    return result


def long_stream(url: str, model: str, max_tokens: int, result: list) -> threading.Thread:
    """A started thread streaming one long greedy chat to `model`; its StreamResult is appended
    to `result` (nothing when the client raised)."""
    body = {"model": model, "messages": user("a long answer please"), "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0}

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            result.append(stream(http, url, "chat/completions", body))

    thread = threading.Thread(target=client)
    thread.start()
    return thread


def leave_mid_stream(url: str, body: dict[str, Any], events: int = 3,
                     timeout: float = 60) -> int:
    """Stream a chat, read `events` SSE events, then close the connection as a client that
    leaves does; returns how many were seen (fewer only if the stream ended first)."""
    seen = 0
    with httpx.Client(timeout=timeout) as client:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen >= events:
                    break  # leaving the block closes the connection mid-stream
    return seen


def error_message(response: httpx.Response) -> str:
    body = response.json()
    err = body.get("error", body)
    return err.get("message", "") if isinstance(err, dict) else str(err)
