"""Operational read-outs on Dynamo's system status server (`DYN_SYSTEM_PORT`).

`GET /engine/kv_pages` -> `{"pages_in_use": n}`: the engine's KV pool occupancy (CPU engine).
`GET /engine/requests` -> `{"in_flight": n, "rids": [...], "scheduler": n}`: requests SGLang's
TokenizerManager still tracks (`rid_to_state`, and its first 64 rids; an entry leaves once the
scheduler reports the request finished or aborted), and requests SGLang's schedulers hold for
every tokenizer process of the engine (`--tokenizer-worker-num`); null for the CPU engine, whose
`in_flight` is its live request count. The end-to-end tests use them to check that aborted and
finished requests free everything they held.
`GET /engine/prefix_cache` -> `{"cached_pages": n, "hit_tokens": n}`: pages the CPU engine's prefix
cache holds and prompt tokens it has served from it since start (null for SGLang); the KV-routing
test reads it to tell which worker served a request. Enabled by
`--debug-routes` (or `DYN_DEBUG_ROUTES=1`); the system server binds to `DYN_SYSTEM_HOST`, which
the worker defaults to its `--host` (loopback by default).
"""

from __future__ import annotations

import asyncio
from typing import Any

from components.backends.base import EngineBackend


def register_debug_routes(runtime: Any, backend: EngineBackend, engine: Any) -> None:
    async def kv_pages(_body: dict) -> dict:
        # Only the CPU engine exposes occupancy; SGLang reports it through its own metrics.
        pages = getattr(engine, "kv_pages_in_use", None)
        # A tokenizer worker asks its engine process: off the event loop.
        return {"pages_in_use": await asyncio.to_thread(pages) if callable(pages) else None}

    async def requests(_body: dict) -> dict:
        # The rids, so a request left behind can be found in the worker's log.
        return {"in_flight": backend.requests_in_flight(engine),
                "rids": backend.tracked_rids(engine),
                "scheduler": backend.scheduler_requests(engine)}

    async def prefix_cache(_body: dict) -> dict:
        cached, hits = (getattr(engine, name, None) for name in ("kv_pages_cached",
                                                                   "prefix_hit_tokens"))
        return {"cached_pages": cached() if callable(cached) else None,
                "hit_tokens": hits() if callable(hits) else None}

    runtime.register_engine_route("kv_pages", kv_pages)
    runtime.register_engine_route("prefix_cache", prefix_cache)
    runtime.register_engine_route("requests", requests)
