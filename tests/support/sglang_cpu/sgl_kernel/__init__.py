"""Exists only to run SGLang on CPU in tests: a pure-torch stand-in for the CPU build of `sgl_kernel`.

With `SGLANG_USE_CPU_ENGINE=1` SGLang imports `sgl_kernel` unconditionally, and its CPU build is not
on the package registry. Only the ops SGLang's torch-native CPU path calls are implemented. Nothing
here registers `torch.ops.sgl_kernel.*`: SGLang then sees no AMX support and keeps RMSNorm, SiLU,
rotary, linear layers and the KV store on their `forward_native` paths.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's slice of `out_cache_loc` into `req_to_token[row, start:end]`
    (the same result as SGLang's triton kernel `assign_req_to_token_pool`)."""
    del pool_len  # the row length is req_to_token.shape[1]
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(),
                               end_offset.tolist()):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken:taken + length].to(req_to_token.dtype)
        taken += length


def _missing_op(name: str) -> Callable[..., Any]:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel stand-in: op {name!r} is not implemented on CPU")

    op.__name__ = name
    return op


def __getattr__(name: str) -> Any:
    """SGLang imports many CPU ops at module level that the torch-native path never calls: each
    name resolves to an op that raises, naming itself, if it is ever called."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing_op(name)
