"""Operational read-outs on Dynamo's system status server (`DYN_SYSTEM_PORT`).

`GET /engine/kv_pages` -> `{"pages_in_use": n}`: the engine's KV pool occupancy. The end-to-end
tests use it to check that aborted and finished requests free everything they held. Enabled by
`--debug-routes` (or `DYN_DEBUG_ROUTES=1`); the system server binds to `DYN_SYSTEM_HOST`, which
the worker defaults to its `--host` (loopback by default).
"""

from __future__ import annotations

from typing import Any


def register_debug_routes(runtime: Any, engine: Any) -> None:
    async def kv_pages(_body: dict) -> dict:
        # Only the CPU engine exposes occupancy; SGLang reports it through its own metrics.
        pages = getattr(engine, "kv_pages_in_use", None)
        return {"pages_in_use": pages() if callable(pages) else None}

    runtime.register_engine_route("kv_pages", kv_pages)
