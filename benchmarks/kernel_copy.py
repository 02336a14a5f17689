"""The kernel's cross-process copy, timed on its own: `process_vm_writev`, the call UCX's `cma`
transport makes for a same-host NIXL WRITE. Pointed at this process itself it walks and pins the
pages and copies exactly as it does into a peer, so it is the bound a same-host WRITE can reach.
"""

from __future__ import annotations

import ctypes
import os
import time


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _iovecs(runs: list[tuple[int, int]]):
    array = (_IoVec * len(runs))()
    for i, (addr, nbytes) in enumerate(runs):
        array[i].base, array[i].len = addr, nbytes
    return array


def kernel_copy_s(src: list[tuple[int, int]], dst: list[tuple[int, int]],
                  per_run: bool = False) -> float:
    """Seconds for one process_vm_writev of `src` runs into `dst` runs (same total size), or,
    with `per_run`, one call per (src, dst) pair of equal length: what UCX `cma` does, one call
    per NIXL descriptor (strace of a 64-run WRITE shows 64 calls of one iovec each)."""
    libc = ctypes.CDLL(None, use_errno=True)
    calls = [([s], [d]) for s, d in zip(src, dst)] if per_run else [(src, dst)]
    prepared = [(_iovecs(s), _iovecs(d)) for s, d in calls]  # built before the clock starts
    pid, want = os.getpid(), sum(n for _, n in src)
    done = 0
    t0 = time.perf_counter()
    for local, remote in prepared:
        done += libc.process_vm_writev(pid, local, len(local), remote, len(remote), 0)
    elapsed = time.perf_counter() - t0
    if done != want:
        raise OSError(ctypes.get_errno(), f"process_vm_writev copied {done} of {want} bytes")
    return elapsed
