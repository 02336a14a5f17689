"""What the engine reads from a model directory: the KV shape, the context, the EOS ids."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from transformers import AutoConfig, GenerationConfig

logger = logging.getLogger(__name__)


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


def context_length(configured: int | None, model_max: int | None) -> int:
    """The engine's context: ``context_length`` if set (never above the model's), else the
    model's ``max_position_embeddings``."""
    if configured is None:
        if model_max is None:
            raise ValueError("the model config has no max_position_embeddings; set context_length")
        return model_max
    if model_max is not None and configured > model_max:
        raise ValueError(
            f"context_length={configured} exceeds the model's "
            f"max_position_embeddings={model_max}"
        )
    return configured


def eos_token_ids(model_path: str, model_config: Any, tokenizer: Any) -> frozenset[int]:
    """EOS ids from generation_config.json, the model config and the tokenizer (as SGLang)."""
    ids: set[int] = set()
    try:
        gen = GenerationConfig.from_pretrained(model_path)
        ids |= _as_set(gen.eos_token_id)
    except OSError:
        logger.info("no generation_config.json in %s", model_path)
    ids |= _as_set(getattr(model_config, "eos_token_id", None))
    if tokenizer is not None:
        ids |= _as_set(tokenizer.eos_token_id)
    return frozenset(ids)


def _as_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}
