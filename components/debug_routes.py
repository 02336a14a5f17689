"""Operational read-outs on Dynamo's system status server (`DYN_SYSTEM_PORT`).

`GET /engine/kv_pages` -> `{"pages_in_use": n}`: the engine's KV pool occupancy (CPU engine).
`GET /engine/requests` -> `{"in_flight": n}`: requests SGLang's TokenizerManager still tracks
(`rid_to_state`; an entry leaves once the scheduler reports the request finished or aborted;
null for the CPU engine, which keeps no such table). The end-to-end tests use them to check that aborted and
finished requests free everything they held. Enabled by
`--debug-routes` (or `DYN_DEBUG_ROUTES=1`); the system server binds to `DYN_SYSTEM_HOST`, which
the worker defaults to its `--host` (loopback by default).
"""

from __future__ import annotations

import asyncio
from typing import Any

from components.compat import sglang_requests_in_flight


def register_debug_routes(runtime: Any, engine: Any) -> None:
    async def kv_pages(_body: dict) -> dict:
        # Only the CPU engine exposes occupancy; SGLang reports it through its own metrics.
        pages = getattr(engine, "kv_pages_in_use", None)
        # A tokenizer worker asks its engine process: off the event loop.
        return {"pages_in_use": await asyncio.to_thread(pages) if callable(pages) else None}

    async def requests(_body: dict) -> dict:
        return {"in_flight": sglang_requests_in_flight(engine)}

    runtime.register_engine_route("kv_pages", kv_pages)
    runtime.register_engine_route("requests", requests)
