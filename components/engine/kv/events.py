"""What the CPU engine tells a KV-aware router: which blocks its prefix cache holds, and its load.

SGLang publishes the same facts from its scheduler (`--kv-events-config`: BlockStored /
BlockRemoved over ZMQ; KV usage through its metrics socket). The CPU engine calls a listener
instead, on its engine thread, and the worker (`components/worker/metrics/kv_events.py`) hands the
calls to Dynamo's `KvEventPublisher` and `WorkerMetricsPublisher`. A block is one KV page (page size
= block size); its hash chains the hashes of every block before it, so a block is named by its
whole prefix, as in Dynamo's router. The router hashes the tokens of a stored block itself;
the engine's hashes only name blocks (parent links, removals).
"""

from __future__ import annotations

from typing import Protocol


class KvEventListener(Protocol):
    def blocks_stored(self, token_ids: list[int], block_hashes: list[int],
                      parent_hash: int | None) -> None:
        """New whole blocks are cached: ``token_ids`` are ``len(block_hashes)`` pages of
        tokens, the first block's parent is ``parent_hash`` (None: it starts a prompt)."""

    def blocks_removed(self, block_hashes: list[int]) -> None:
        """These blocks left the cache (evicted)."""

    def load(self, kv_used_pages: int, running: int, waiting: int) -> None:
        """The engine's load changed: pages held by requests (not by the cache), requests
        running and waiting."""
