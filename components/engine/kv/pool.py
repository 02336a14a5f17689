"""The KV pool: one preallocated tensor, handed out to requests as contiguous runs of pages.

``tensor`` is always indexed ``[layers, 2 (K, V), kv_heads, num_pages * page_size, head_dim]``;
``storage`` is the same memory in the order the pool's ``layout`` picks (``LAYOUTS``):

- ``head`` (the default), ``[layers, 2, kv_heads, tokens, head_dim]``: one request's K (or V)
  of one layer and head is one contiguous range, so attention reads contiguous rows; NIXL moves
  a request as ``layers * 2 * kv_heads`` descriptors;
- ``token``, ``[tokens, layers, 2, kv_heads, head_dim]``: a request's whole KV is one range, one
  NIXL descriptor (UCX's same-host ``cma`` transport makes one kernel copy per descriptor), but
  attention reads strided rows: decode attention 1.2-1.4x slower (docs/benchmarks.md);
- ``layer``, ``[layers, tokens, 2, kv_heads, head_dim]``: one range per layer.

Attention reads ``tensor`` through views (no copy) whatever the layout. Two engines move KV only
between pools of the same layout (the peers' ``KVLayout`` names it).

Used only on the engine thread (no locking).
"""

from __future__ import annotations

import bisect
import itertools
import logging
from dataclasses import dataclass

import torch

from components.engine.kv.host_memory import zeroed_tensor

logger = logging.getLogger(__name__)

# Storage order of the logical dims (0 layers, 1 K/V, 2 kv_heads, 3 tokens, 4 head_dim).
LAYOUTS: dict[str, tuple[int, ...]] = {
    "head": (0, 1, 2, 3, 4),
    "token": (3, 0, 1, 2, 4),
    "layer": (0, 3, 1, 2, 4),
}
DEFAULT_LAYOUT = "head"
_TOKENS = 3


@dataclass(frozen=True)
class PageRun:
    """A request's page table: ``num_pages`` pages starting at ``start_page``."""

    start_page: int
    num_pages: int


class ExtentAllocator:
    """First-fit allocator of contiguous page runs; frees merge with their neighbours."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # Sorted, disjoint, non-adjacent free extents as parallel lists (start, length).
        self._starts: list[int] = [0]
        self._lengths: list[int] = [num_pages]
        self.pages_in_use = 0

    def allocate(self, n: int) -> PageRun | None:
        """A run of ``n`` pages, or None when no free extent is long enough now."""
        if n <= 0:
            raise ValueError(f"page count must be positive, got {n}")
        for i, length in enumerate(self._lengths):
            if length >= n:
                start = self._starts[i]
                if length == n:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] = start + n
                    self._lengths[i] = length - n
                self.pages_in_use += n
                return PageRun(start, n)
        return None

    def free(self, run: PageRun) -> None:
        start, n = run.start_page, run.num_pages
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] < start + n:
            raise RuntimeError(f"double free of pages {run}")
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] > start:
            raise RuntimeError(f"double free of pages {run}")
        merge_left = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start
        merge_right = i < len(self._starts) and self._starts[i] == start + n
        if merge_left and merge_right:
            self._lengths[i - 1] += n + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif merge_left:
            self._lengths[i - 1] += n
        elif merge_right:
            self._starts[i] = start
            self._lengths[i] += n
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, n)
        self.pages_in_use -= n

    def largest_free(self) -> int:
        return max(self._lengths, default=0)


class KVPool:
    """The preallocated K/V tensor plus its page allocator."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        layout: str = DEFAULT_LAYOUT,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown KV pool layout {layout!r} (one of {sorted(LAYOUTS)})")
        self.layout = layout
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_tokens = num_pages * page_size
        # Zeroed (pages touched once here, not on the first requests), on huge pages.
        logical = (num_layers, 2, num_kv_heads, self.num_tokens, head_dim)
        order = LAYOUTS[layout]
        self.storage, self._mapping = zeroed_tensor(tuple(logical[d] for d in order), dtype)
        self.tensor = self.storage.permute(*(order.index(d) for d in range(len(order))))
        self._alloc = ExtentAllocator(num_pages)
        self.element_size = self.tensor.element_size()
        logger.info(
            "KV pool: %d pages x %d tokens, %.1f MiB (%s, %s-major)",
            num_pages, page_size, self.nbytes / 2**20, dtype, layout,
        )

    # --- allocation -------------------------------------------------------------------------
    @property
    def pages_in_use(self) -> int:
        return self._alloc.pages_in_use

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.element_size

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, num_tokens: int) -> PageRun | None:
        """Pages for ``num_tokens`` tokens as one run, or None if the pool cannot fit them now."""
        return self._alloc.allocate(self.pages_for(num_tokens))

    def free(self, run: PageRun) -> None:
        self._alloc.free(run)

    # --- views for attention ------------------------------------------------------------------
    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[kv_heads, num_tokens, head_dim]`` K and V planes of one layer."""
        return self.tensor[layer, 0], self.tensor[layer, 1]

    def k_view(self, layer: int, start_tok: int, length: int) -> torch.Tensor:
        """``[1, kv_heads, length, head_dim]`` view of K for tokens ``start_tok..+length``."""
        return self.tensor[layer, 0, :, start_tok:start_tok + length].unsqueeze(0)

    # --- NIXL descriptors ---------------------------------------------------------------------
    @property
    def data_ptr(self) -> int:
        return self.storage.data_ptr()

    def token_runs(self, run: PageRun, num_tokens: int, skip: int = 0) -> list[tuple[int, int]]:
        """(addr, nbytes) of a request's first ``num_tokens`` tokens but the first ``skip``
        (those a decode already holds): one run per index of the
        storage dims outside the token dim (none for ``token``, layers for ``layer``, layer,
        K/V and head for ``head``), in storage order. Prefill and decode use the same layout
        (checked at peering), so the i-th source run pairs with the i-th destination run.
        """
        capacity = run.num_pages * self.page_size
        if not 0 < num_tokens <= capacity:
            raise ValueError(f"num_tokens {num_tokens} outside the request's {capacity} slots")
        if not 0 <= skip < num_tokens:
            raise ValueError(f"skip {skip} outside [0, {num_tokens})")
        axis = LAYOUTS[self.layout].index(_TOKENS)
        el = self.element_size
        tok_bytes = self.storage.stride(axis) * el
        first = self.data_ptr + (run.start_page * self.page_size + skip) * tok_bytes
        strides = [st * el for st in self.storage.stride()[:axis]]
        nbytes = (num_tokens - skip) * tok_bytes
        return [(first + sum(i * st for i, st in zip(idx, strides)), nbytes)
                for idx in itertools.product(*(range(n) for n in self.storage.shape[:axis]))]
