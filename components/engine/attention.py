"""Attention that reads and writes K/V in place in the engine's pool ("slotpool").

Registered with ``transformers.AttentionInterface`` so stock HF decoder layers call it with the
new tokens' query/key/value (after RoPE). No HF ``Cache`` is involved: the model runs with
``use_cache=False`` and the per-step metadata travels as the ``kv_meta`` keyword argument, which
HF passes through to the attention function unchanged (reference/cpu-engine-paged-kv.md).
Without ``kv_meta`` the stock SDPA function runs, so ``model.generate`` still works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from components.engine.kv_pool import KVPool

ATTN_IMPLEMENTATION = "slotpool"


@dataclass
class StepMeta:
    """What one forward needs to find each row's K/V in the pool.

    ``starts[b]``: pool token index of row b's first token. ``lens[b]``: tokens of row b already
    in the pool before this forward. Prefill rows (one row, ``lens == [0]``) write their whole
    prompt; decode rows write one token each at ``write_pos[b] = starts[b] + lens[b]``.
    """

    pool: KVPool
    is_prefill: bool
    starts: list[int]
    lens: list[int]
    write_pos: torch.Tensor | None = None

    @classmethod
    def prefill(cls, pool: KVPool, start: int) -> "StepMeta":
        return cls(pool=pool, is_prefill=True, starts=[start], lens=[0])

    @classmethod
    def decode(cls, pool: KVPool, starts: list[int], lens: list[int]) -> "StepMeta":
        pos = torch.tensor([s + n for s, n in zip(starts, lens)], dtype=torch.long)
        return cls(pool=pool, is_prefill=False, starts=starts, lens=lens, write_pos=pos)


def slotpool_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    meta: StepMeta | None = kwargs.get("kv_meta")
    if meta is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if meta.is_prefill:
        return _prefill(module, meta, query, key, value, scaling)
    return _decode(module, meta, query, key, value, scaling)


def _prefill(module, meta: StepMeta, query, key, value, scaling):
    """One request from position 0: store its K/V, then causal SDPA as stock ``sdpa`` does."""
    if query.shape[0] != 1 or meta.lens[0] != 0:
        raise RuntimeError("slotpool prefill handles one request starting at position 0")
    k_plane, v_plane = meta.pool.layer_kv(module.layer_idx)
    start, t = meta.starts[0], key.shape[2]
    k_plane[:, start:start + t].copy_(key[0])
    v_plane[:, start:start + t].copy_(value[0])
    out = F.scaled_dot_product_attention(
        query, key, value, is_causal=t > 1, scale=scaling,
        enable_gqa=getattr(module, "num_key_value_groups", 1) > 1,
    )
    return out.transpose(1, 2).contiguous(), None


def _decode(module, meta: StepMeta, query, key, value, scaling):
    """One new token per row: write it at the row's position, then per-row SDPA on pool views."""
    layer = module.layer_idx
    k_plane, v_plane = meta.pool.layer_kv(layer)
    # [B, kvh, 1, hd] -> [kvh, B, hd], scattered to each row's own position.
    k_plane[:, meta.write_pos] = key[:, :, 0].transpose(0, 1)
    v_plane[:, meta.write_pos] = value[:, :, 0].transpose(0, 1)
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    # GQA folded into the query axis: [B, kvh, group, hd]; no repeat_kv, no mask needed.
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    outs = []
    for b, (start, length) in enumerate(zip(meta.starts, meta.lens)):
        n = length + 1
        outs.append(
            F.scaled_dot_product_attention(
                packed[b:b + 1],
                k_plane[:, start:start + n].unsqueeze(0),
                v_plane[:, start:start + n].unsqueeze(0),
                scale=scaling,
            )
        )
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.reshape(batch, 1, heads, head_dim), None


def register() -> None:
    """Make ``attn_implementation="slotpool"`` available (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, slotpool_attention_forward)
