"""Prefix caching, SGLang's radix cache in effect: a repeated prompt prefix is not recomputed.

When a request finishes, the full pages of its KV (prompt and output tokens) stay in the pool
as a cache entry instead of being freed. Entries are found by chained hashes of page-sized token
blocks (block ``k``'s key covers blocks ``0..k``), the scheme Dynamo's KV router uses for block
hashes. A new request whose prompt starts with cached blocks gets their K/V copied into its own
pages and prefills only the rest (the copy costs a memcpy; the forward it saves costs far more).

Copying rather than sharing pages keeps every request's KV one contiguous run, so attention reads
plain views and NIXL moves a request in a few long runs. An entry is never in use once its copy
is done, so nothing needs reference counts: when the pool is short, entries are evicted least
recently used first. Used on the engine thread only.

With a listener (``components/engine/kv/events.py``) the cache reports the blocks it starts and
stops holding, for a KV-aware router: the blocks an insert adds, the blocks an eviction drops.
A block that moves from one entry to a longer one stays cached and is not reported.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from components.engine.kv.events import KvEventListener
from components.engine.kv.pool import KVPool, PageRun

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Entry:
    tokens: list[int]  # whole pages only
    run: PageRun
    keys: set[int] = field(default_factory=set)  # block keys that still lead here
    last_used: int = 0


class PrefixCache:
    def __init__(self, pool: KVPool) -> None:
        self._pool = pool
        self._page = pool.page_size
        self._by_key: dict[int, _Entry] = {}
        self._entries: set[_Entry] = set()
        self._clock = itertools.count(1)
        self.pages = 0  # pool pages the cache holds
        self.hit_tokens = 0  # prompt tokens served from the cache so far
        self.listener: KvEventListener | None = None

    def block_keys(self, tokens: list[int], max_blocks: int) -> list[int]:
        keys, key, page = [], 0, self._page
        for k in range(min(max_blocks, len(tokens) // page)):
            key = hash((key, tuple(tokens[k * page:(k + 1) * page])))
            keys.append(key)
        return keys

    def reuse(self, ids: list[int], dst_start_tok: int) -> int:
        """Copy the longest cached prefix of ``ids`` (whole pages, leaving at least one token to
        compute) into the pool at ``dst_start_tok``; -> the number of tokens copied."""
        best: _Entry | None = None
        n_blocks = 0
        for k, key in enumerate(self.block_keys(ids, (len(ids) - 1) // self._page), 1):
            entry = self._by_key.get(key)
            if entry is None:
                break
            best, n_blocks = entry, k
        n = n_blocks * self._page
        if best is None or best.tokens[:n] != ids[:n]:  # a hash collision is a miss
            return 0
        best.last_used = next(self._clock)
        self.hit_tokens += n
        src = best.run.start_page * self._page
        kv = self._pool.tensor
        kv[:, :, :, dst_start_tok:dst_start_tok + n].copy_(kv[:, :, :, src:src + n])
        return n

    def insert(self, tokens: list[int], run: PageRun) -> PageRun | None:
        """Keep the whole pages of a finished request's KV (``tokens`` are the tokens whose K/V
        are in ``run``); -> the pages to free (None: none)."""
        keys = self.block_keys(tokens, run.num_pages)
        if not keys or self._covered(keys):
            return run
        entry = _Entry(tokens[:len(keys) * self._page], PageRun(run.start_page, len(keys)),
                       last_used=next(self._clock))
        self._report_stored(entry.tokens, keys)
        for key in keys:
            old = self._by_key.get(key)
            if old is not None:
                old.keys.discard(key)
                if not old.keys:  # every prefix it served is served by the new entry
                    self._drop(old)
            self._by_key[key] = entry
            entry.keys.add(key)
        self._entries.add(entry)
        self.pages += entry.run.num_pages
        tail = run.num_pages - len(keys)
        return PageRun(run.start_page + len(keys), tail) if tail else None

    def allocate(self, num_tokens: int) -> PageRun | None:
        """Pool pages for ``num_tokens``, evicting least recently used entries until a run fits
        or nothing is left to evict. One round of evictions may not be enough: the pages it
        frees need not be adjacent, and a request needs one contiguous run."""
        pages = self._pool.allocate(num_tokens)
        while pages is None and self.pages:
            self.evict(self._pool.pages_for(num_tokens))
            pages = self._pool.allocate(num_tokens)
        return pages

    def evict(self, pages_wanted: int) -> int:
        """Free least recently used entries until ``pages_wanted`` pages came back (or the
        cache is empty); -> pages freed."""
        freed = 0
        for entry in sorted(self._entries, key=lambda e: e.last_used):
            if freed >= pages_wanted:
                break
            freed += entry.run.num_pages
            self._drop(entry)
        if freed:
            logger.debug("prefix cache: evicted %d pages", freed)
        return freed

    def _covered(self, keys: list[int]) -> bool:
        """Whether an entry already holds all these blocks (no second copy is kept)."""
        entry = self._by_key.get(keys[-1])
        return entry is not None and keys[-1] in entry.keys

    def _report_stored(self, tokens: list[int], keys: list[int]) -> None:
        """Report the blocks from the first one not cached yet to the end (a block that is
        cached again after its prefix was evicted is reported again, with its parent)."""
        if self.listener is None:
            return
        first = next((k for k, key in enumerate(keys) if key not in self._by_key), None)
        if first is not None:
            self.listener.blocks_stored(tokens[first * self._page:], keys[first:],
                                        keys[first - 1] if first else None)

    def _drop(self, entry: _Entry) -> None:
        if self.listener is not None and entry.keys:
            self.listener.blocks_removed([k for k in entry.keys if self._by_key.get(k) is entry])
        for key in entry.keys:
            if self._by_key.get(key) is entry:
                del self._by_key[key]
        entry.keys.clear()
        self._entries.discard(entry)
        self.pages -= entry.run.num_pages
        self._pool.free(entry.run)
