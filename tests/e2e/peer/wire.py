"""Raw SSE chunks and the peers' shared request bodies, for the peer-compatibility suite."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.client import user

# Few tokens per request keep the suite fast; greedy and ignore_eos make the counts exact.
MAX_TOKENS = 6
SYSTEM = {"role": "system", "content": "You are a helpful AI assistant"}


def chat_body(model: str, content: str = "Tell me about the sea.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [SYSTEM, *user(content)], "temperature": 0,
            "max_tokens": MAX_TOKENS, "ignore_eos": True, **extra}


def chunks(http: httpx.Client, url: str, path: str, body: dict[str, Any]) -> list[dict]:
    """Every `data:` chunk of a streamed answer, in order, up to `[DONE]` (which must come);
    an error event fails the caller."""
    out: list[dict] = []
    with http.stream("POST", f"{url}/v1/{path}", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read().decode()
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                return out
            event = json.loads(payload)
            assert "error" not in event, f"error event after {len(out)} chunks: {event['error']}"
            out.append(event)
    raise AssertionError(f"the stream ended without [DONE] after {len(out)} chunks")


def content_of(events: list[dict]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


def error_body(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    """The frontend's error object (`{"message", "type", "code"}`), checked for its shape."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"message", "type", "code"}, body
    assert body["code"] == status and isinstance(body["message"], str), body
    return body
