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


def kernel_copy_s(src: list[tuple[int, int]], dst: list[tuple[int, int]]) -> float:
    """Seconds for one process_vm_writev of `src` runs into `dst` runs (same total size)."""
    libc = ctypes.CDLL(None, use_errno=True)
    local, remote = _iovecs(src), _iovecs(dst)
    want = sum(n for _, n in src)
    t0 = time.perf_counter()
    done = libc.process_vm_writev(os.getpid(), local, len(src), remote, len(dst), 0)
    elapsed = time.perf_counter() - t0
    if done != want:
        raise OSError(ctypes.get_errno(), f"process_vm_writev copied {done} of {want} bytes")
    return elapsed
