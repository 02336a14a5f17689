"""The KV pool's host memory: one anonymous mapping backed by transparent huge pages.

A KV WRITE between processes on one host is a kernel copy (UCX's `cma` transport,
`process_vm_writev`) that pins the pages of both sides one by one; 2 MiB pages make that
512x fewer pages to walk, which is what brings the transfer near a same-process memcpy
(`benchmarks/bench_kv_transfer.py`). Linux honours the advice only where THP is `madvise` or
`always` (`/sys/kernel/mm/transparent_hugepage/enabled`); elsewhere the mapping is ordinary
pages and everything works the same, only slower.
"""

from __future__ import annotations

import logging
import math
import mmap

import torch

logger = logging.getLogger(__name__)


def zeroed_tensor(shape: tuple[int, ...], dtype: torch.dtype
                  ) -> tuple[torch.Tensor, mmap.mmap | None]:
    """A zero-filled contiguous CPU tensor in its own mapping; keep the mapping alive with it."""
    count = math.prod(shape)
    if count == 0:  # nothing to map (mmap refuses length 0)
        return torch.zeros(shape, dtype=dtype), None
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mapping.madvise(advice)
        except OSError as exc:  # a kernel without THP: ordinary pages
            logger.debug("madvise(MADV_HUGEPAGE) refused: %s", exc)
    tensor = torch.frombuffer(mapping, dtype=dtype, count=count).view(shape)
    tensor.zero_()  # touch every page once here (as huge pages), not on the first requests
    return tensor, mapping
