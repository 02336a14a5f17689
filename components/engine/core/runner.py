"""Loads the HF model with slotpool attention and runs one forward per scheduler batch.

Everything here runs on the engine thread only: libgomp throttles when torch has run on more
than one OS thread of a process, so all torch work stays on the engine thread.
"""

from __future__ import annotations

import logging
import torch
from transformers import AutoModelForCausalLM

from components.engine.model import attention
from components.engine.model.attention import Segment, StepMeta
from components.engine.core.batch import Batch, PrefillChunk
from components.engine.output.logprobs import prompt_logprobs
from components.engine.config import DTYPES
from components.engine.kv.pool import KVPool

logger = logging.getLogger(__name__)

TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}  # the names EngineConfig takes


class ModelRunner:
    """The model; ``forward(batch)`` packs every row's new tokens into one sequence."""

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
    def forward(self, batch: Batch) -> torch.Tensor:
        """Write the batch's new K/V into the pool; -> logits ``[len(batch.sampled), V]``,
        one row per sampled row (a prompt chunk that ends its prompt, or a decode row)."""
        tokens: list[int] = []
        positions: list[torch.Tensor] = []
        segments: list[Segment] = []
        keep: list[int] = []
        prompt_rows: list[tuple[PrefillChunk, int, int]] = []  # (chunk, first position, row)
        extra: list[int] = []  # prompt positions whose logits the request's logprobs need
        for chunk in batch.prefill:
            seq, n = chunk.seq, chunk.end - chunk.begin
            span = _prompt_logprob_span(chunk)
            if span is not None:
                prompt_rows.append((chunk, span[0], len(extra)))
                offset = len(tokens) - chunk.begin
                extra += range(span[0] + offset, span[1] + offset)
            tokens += seq.input_ids[chunk.begin:chunk.end]
            positions.append(torch.arange(chunk.begin, chunk.end))
            segments.append(Segment(seq.start_tok, chunk.begin, n))
            if chunk.completes_prompt:
                keep.append(len(tokens) - 1)
        decode_positions: list[int] = []  # one tensor for all decode rows, not one per row
        for seq in batch.decode:
            tokens.append(seq.output_ids[-1])
            decode_positions.append(seq.kv_len)
            segments.append(Segment(seq.start_tok, seq.kv_len, 1))
            keep.append(len(tokens) - 1)
        if decode_positions:
            positions.append(torch.tensor(decode_positions, dtype=torch.long))
        position_ids = torch.cat(positions) if len(positions) > 1 else positions[0]
        out = self.model(
            input_ids=torch.tensor([tokens], dtype=torch.long),
            position_ids=position_ids.unsqueeze(0),
            use_cache=False,
            logits_to_keep=torch.tensor(keep + extra, dtype=torch.long),
            kv_meta=StepMeta.build(self.pool, segments),
        )
        logits = out.logits[0].float()
        if extra:
            _record_prompt_logprobs(prompt_rows, logits[len(keep):])
            logits = logits[:len(keep)]
        return logits


def _prompt_logprob_span(chunk: PrefillChunk) -> tuple[int, int] | None:
    """The chunk's positions [first, last) whose logits give prompt logprobs: from the
    request's start on, short of the prompt's last position (that one samples)."""
    seq = chunk.seq
    if not seq.wants_prompt_logprobs:
        return None
    first = max(chunk.begin, seq.logprob_start_len)
    last = min(chunk.end, seq.prompt_len - 1)
    return (first, last) if first < last else None


def _record_prompt_logprobs(rows: list[tuple[PrefillChunk, int, int]],
                            logits: torch.Tensor) -> None:
    """Each chunk's prompt positions -> the logprob of the prompt token that follows each."""
    for chunk, first, row in rows:
        seq = chunk.seq
        last = min(chunk.end, seq.prompt_len - 1)
        seq.in_logprobs += prompt_logprobs(logits[row:row + last - first],
                                           seq.input_ids[first + 1:last + 1],
                                           seq.top_logprobs_num)
