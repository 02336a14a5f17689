"""Loads the HF model with slotpool attention and runs prefill and batched decode forwards.

Everything here runs on the engine thread only (study pitfall 3: all torch work on one OS thread).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from components.engine import attention
from components.engine.attention import StepMeta
from components.engine.kv_pool import KVPool

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None


def read_model_shape(model_path: str) -> ModelShape:
    """The dimensions the KV pool needs, from config.json alone (no weights loaded)."""
    cfg = AutoConfig.from_pretrained(model_path)
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelShape(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
    )


class ModelRunner:
    """The model plus the two forward shapes the scheduler uses."""

    def __init__(self, model_path: str, dtype: str, pool: KVPool) -> None:
        attention.register()
        self.pool = pool
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path,
            dtype=TORCH_DTYPES[dtype],
            attn_implementation=attention.ATTN_IMPLEMENTATION,
        )
        self.model.eval()
        self.vocab_size = self.model.config.vocab_size
        logger.info("loaded %s (%s, %d layers)", model_path, dtype, pool.num_layers)

    @torch.inference_mode()
    def prefill(self, input_ids: list[int], start_tok: int) -> torch.Tensor:
        """Forward the whole prompt of one request; its K/V land in the pool. -> logits [V]."""
        ids = torch.tensor([input_ids], dtype=torch.long)
        pos = torch.arange(len(input_ids), dtype=torch.long).unsqueeze(0)
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            use_cache=False,
            logits_to_keep=1,
            kv_meta=StepMeta.prefill(self.pool, start_tok),
        )
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def decode(self, tokens: list[int], starts: list[int], lens: list[int]) -> torch.Tensor:
        """One step for B rows: row b feeds ``tokens[b]`` at position ``lens[b]``.

        -> logits [B, V]."""
        ids = torch.tensor(tokens, dtype=torch.long).unsqueeze(1)
        pos = torch.tensor(lens, dtype=torch.long).unsqueeze(1)
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            use_cache=False,
            kv_meta=StepMeta.decode(self.pool, starts, lens),
        )
        return out.logits[:, -1].float()
