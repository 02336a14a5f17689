"""Write a small, real Hugging Face model directory, deterministic from a seed.

No model can be downloaded on the project's machines, so tests, demos and benchmarks run on
a Llama-architecture causal LM built here: random weights, scaled so that greedy output is
varied (random init at std 0.02 repeats one token, which makes token-exact comparisons weak).
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from components.model_builder.templates import ADDED_TOKENS, TEMPLATES
from components.model_builder.tokenizer import ENDOFTEXT, IM_END, train_tokenizer

logger = logging.getLogger(__name__)

VOCAB_SIZE = 2048
WEIGHT_SCALE = 4.0  # x4: varied greedy output (at x1 it repeats one token)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int


SIZES = {
    "tiny": ModelSize(64, 2, 4, 2, 256, 8192),
    "small": ModelSize(512, 8, 8, 4, 1536, 8192),  # about 26M parameters
}


def build_model_dir(out: str | Path, size: str = "tiny", seed: int = 0,
                    chat_template: str = "chatml") -> Path:
    """Build the model directory at `out` (overwriting its files) and return its path.
    `chat_template` (templates.py): the tokenizer's template and its added marker tokens."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if chat_template not in TEMPLATES:
        raise ValueError(f"unknown chat template {chat_template!r}; choose one of "
                         f"{sorted(TEMPLATES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(VOCAB_SIZE)
    tokenizer.chat_template = TEMPLATES[chat_template]
    tokenizer.add_tokens(ADDED_TOKENS[chat_template])  # before the config reads len(tokenizer)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    dims = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=dims.hidden_size,
        num_hidden_layers=dims.num_hidden_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        intermediate_size=dims.intermediate_size,
        max_position_embeddings=dims.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=eos_ids[1],
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[1],
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(WEIGHT_SCALE)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_ids[1], eos_token_id=eos_ids, pad_token_id=eos_ids[1], do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _write_build_info(out, size, seed, model)
    logger.info("built %s model (seed %d, %d params) at %s", size, seed, model.num_parameters(), out)
    return out


def _write_build_info(out: Path, size: str, seed: int, model: LlamaForCausalLM) -> None:
    info = {"size": size, "seed": seed, "parameters": model.num_parameters()}
    (out / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
