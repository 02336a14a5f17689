"""Attention that reads and writes K/V in place in the engine's pool ("slotpool").

Registered with ``transformers.AttentionInterface`` so stock HF decoder layers call it with the
new tokens' query/key/value (after RoPE). No HF ``Cache`` is involved: the model runs with
``use_cache=False`` and the per-forward metadata travels as the ``kv_meta`` keyword argument,
which HF passes through to the attention function unchanged. Without ``kv_meta`` the stock SDPA
function runs, so ``model.generate`` still works (the tests compare against it).

One forward carries the new tokens of several requests packed into one sequence ("segments"):
a whole prompt, a chunk of one, or one decode token. Each segment attends only to its own
request's K/V in the pool, so the packing needs no mask between segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from components.engine.kv.pool import KVPool

ATTN_IMPLEMENTATION = "slotpool"


@dataclass(frozen=True)
class Segment:
    """One request's new tokens in a forward: ``length`` tokens at positions
    ``offset..offset+length``; ``start`` is the pool index of the request's position 0."""

    start: int
    offset: int
    length: int


@dataclass
class StepMeta:
    """Where each segment's K/V live in the pool; ``write_pos`` is computed once per forward
    and reused by every layer."""

    pool: KVPool
    segments: list[Segment]
    write_pos: torch.Tensor

    @classmethod
    def build(cls, pool: KVPool, segments: list[Segment]) -> "StepMeta":
        if all(s.length == 1 for s in segments):  # a decode step: one tensor, not one per row
            pos = torch.tensor([s.start + s.offset for s in segments], dtype=torch.long)
        else:
            pos = torch.cat([torch.arange(s.start + s.offset, s.start + s.offset + s.length)
                             for s in segments])
        return cls(pool=pool, segments=segments, write_pos=pos)


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
    if query.shape[0] != 1:
        raise RuntimeError("slotpool attention takes one packed sequence per forward")
    k_plane, v_plane = meta.pool.layer_kv(module.layer_idx)
    # [1, kvh, T, hd] -> [kvh, T, hd], each token to its request's slot.
    k_plane[:, meta.write_pos] = key[0]
    v_plane[:, meta.write_pos] = value[0]
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    outs, a = [], 0
    for seg in meta.segments:
        b = a + seg.length
        if seg.length == 1:
            outs.append(_one_token(query[:, :, a:b], k_plane, v_plane, seg, scaling))
        elif seg.offset == 0:  # a whole prompt: its own fresh K/V, causal
            out = F.scaled_dot_product_attention(
                query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                scale=scaling, enable_gqa=gqa)
            outs.append(out[0].transpose(0, 1))
        else:
            outs.append(_chunk(query[:, :, a:b], k_plane, v_plane, seg, scaling, gqa))
        a = b
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.unsqueeze(0), None


def _one_token(q, k_plane, v_plane, seg: Segment, scaling) -> torch.Tensor:
    """A decode token over the request's pool rows; GQA folded into the query axis (no
    repeat_kv, no mask). -> [1, heads, hd]."""
    _, heads, _, head_dim = q.shape
    kv_heads = k_plane.shape[0]
    packed = q.reshape(1, kv_heads, heads // kv_heads, head_dim)
    n = seg.offset + 1
    out = F.scaled_dot_product_attention(
        packed,
        k_plane[:, seg.start:seg.start + n].unsqueeze(0),
        v_plane[:, seg.start:seg.start + n].unsqueeze(0),
        scale=scaling,
    )
    return out.reshape(1, heads, head_dim)


def _chunk(q, k_plane, v_plane, seg: Segment, scaling, gqa: bool) -> torch.Tensor:
    """A prompt chunk after earlier chunks: attends to everything in the pool up to itself.
    -> [length, heads, hd]."""
    n = seg.offset + seg.length
    # Query i sits at position offset+i and sees keys 0..offset+i (bottom-right causal).
    mask = torch.arange(n).unsqueeze(0) <= torch.arange(seg.offset, n).unsqueeze(1)
    out = F.scaled_dot_product_attention(
        q,
        k_plane[:, seg.start:seg.start + n].unsqueeze(0),
        v_plane[:, seg.start:seg.start + n].unsqueeze(0),
        attn_mask=mask, scale=scaling, enable_gqa=gqa,
    )
    return out[0].transpose(0, 1)


def register() -> None:
    """Make ``attn_implementation="slotpool"`` available (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, slotpool_attention_forward)
