"""Postprocess on the engine thread: logits -> tokens -> finish checks -> SGLang chunks.

Chunks have SGLang's incremental-stream shape: ``{"output_ids", "text"?, "meta_info": {"id",
"finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"?}}``, with
``finish_reason`` None until the last chunk (docs/reference/engine-api.md).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import torch

from components.engine.core.batch import Batch
from components.engine.output.detokenizer import IncrementalDetokenizer, StopStringMatcher
from components.engine.core.first_choices import FirstChoices, copy_rows, sample_choices
from components.engine.core.forks import choice_seed, expand
from components.engine.output.grammar import BitmaskApplier, RequestGrammar
from components.engine.output.logprobs import (
    TokenLogprob, input_meta_fields, meta_fields, token_logprobs,
)
from components.engine.output.sampling import SamplingFailed, SamplingState, make_generator, sample
from components.engine.core.sequence import Sequence

logger = logging.getLogger(__name__)

FinishReason = dict[str, Any]


def finish_stop_token(token: int) -> FinishReason:
    return {"type": "stop", "matched": token}


def finish_stop_str(stop: str) -> FinishReason:
    return {"type": "stop", "matched": stop}


def finish_length(n: int) -> FinishReason:
    return {"type": "length", "length": n}


def finish_abort(message: str, status_code: int | None = None) -> FinishReason:
    return {"type": "abort", "message": message, "status_code": status_code}


class OutputProcessor:
    def __init__(self, tokenizer: Any, eos_ids: frozenset[int], vocab_size: int,
                 stream_interval: int, random_seed: int, defer_first_token: bool) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._stream_interval = stream_interval
        self._seeds = random.Random(random_seed)
        # Prefill mode: the first token leaves with the KV, not from the forward that made it.
        self._defer_first_token = defer_first_token
        self._masks = BitmaskApplier(vocab_size)

    def init_request(self, seq: Sequence) -> None:
        """Sampler state (own seeded RNG) and, with a tokenizer, detokenizer and stop matcher."""
        p = seq.params
        stop_ids = () if p.ignore_eos else tuple(self.eos_ids | p.stop_token_ids)
        seed = choice_seed(p.sampling_seed, seq.index)
        seq.sampling = SamplingState(p, make_generator(p, self._seeds.getrandbits(63), seed),
                                     stop_ids, seq.output_ids)
        if self._defer_first_token and p.n > 1:  # prefill: one row samples every choice's first
            seq.first_choices = FirstChoices([
                SamplingState(p, make_generator(p, self._seeds.getrandbits(63),
                                                choice_seed(p.sampling_seed, i)), stop_ids, [])
                for i in range(1, p.n)])
        if self.tokenizer is not None:
            seq.detok = IncrementalDetokenizer(self.tokenizer, seq.input_ids, p.skip_special_tokens,
                                               p.spaces_between_special_tokens)
            seq.stops = StopStringMatcher(p.stop, p.no_stop_trim)

    def postprocess(self, batch: Batch, logits: torch.Tensor
                    ) -> list[tuple[Sequence, int, FinishReason | None]]:
        """Sample each row's next token, append it, stream what is due. -> per sampled row
        ``(seq, token, finish reason or None)``; the scheduler applies the finishes."""
        rows, logits = expand(batch.sampled, logits)  # n > 1: the choices forking off now
        self._masks.apply(logits, [s.grammar for s in rows])
        copies = copy_rows(rows, logits) if self._defer_first_token else []
        tokens = sample(logits, [s.sampling for s in rows])
        _record_logprobs(rows, tokens, logits)
        failed = sample_choices(copies) if copies else {}
        out = []
        for seq, token in zip(rows, tokens):
            if isinstance(token, SamplingFailed):  # this request alone; its parameters did it
                out.append((seq, -1, finish_abort(token.message, 400)))
            elif id(seq) in failed:
                out.append((seq, -1, finish_abort(failed[id(seq)], 400)))
            elif self._defer_first_token and not seq.output_ids:
                out.append((seq, token, None))
            else:
                out.append((seq, token, self.append(seq, token)))
        return out

    def append(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append one generated token; -> the finish reason it causes, else stream what is due."""
        seq.output_ids.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        p = seq.params
        reason = None
        if not p.ignore_eos and (token in self.eos_ids or token in p.stop_token_ids):
            reason = finish_stop_token(token)
        if seq.detok is not None and (reason is None or p.no_stop_trim):
            emit, matched = seq.stops.push(seq.detok.add(token))
            seq.unsent_text += emit
            if matched is not None:
                reason = finish_stop_str(matched)
        if seq.grammar is not None and reason is None:
            reason = _grammar_finish(seq.grammar, token)
        if reason is None and len(seq.output_ids) >= seq.max_new_tokens:
            reason = finish_length(seq.max_new_tokens)
        if reason is None:
            self.emit(seq)
        return reason

    def adopt_first_token(self, seq: Sequence, token: int,
                          logprob: TokenLogprob | None) -> FinishReason | None:
        """Decode mode: the prefill engine sampled ``token`` (and computed its logprobs when
        asked); continue from it."""
        _skip_prefill_draw(seq, self.vocab_size)
        if seq.return_logprob and logprob is not None:
            seq.out_logprobs.append(
                TokenLogprob(logprob.logprob, logprob.top[:seq.top_logprobs_num]))
        return self.append(seq, token)

    def add_prefill_token(self, seq: Sequence, token: int) -> None:
        """Prefill mode: the token goes out in the request's single, final chunk."""
        seq.output_ids.append(token)
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        if seq.detok is not None:
            seq.unsent_text += seq.detok.add(token)

    def finalize(self, seq: Sequence, reason: FinishReason) -> None:
        """Set the finish reason and release held-back text (sent by ``send_final``)."""
        if seq.detok is not None and reason["type"] != "abort" and not _is_stop_str(reason):
            seq.unsent_text += seq.stops.push(seq.detok.flush())[0] + seq.stops.flush()
        seq.finish_reason = reason

    def send_final(self, seq: Sequence) -> None:
        self.emit(seq)
        reason = seq.finish_reason
        ttft_ms = (seq.first_token_at - seq.created_at) * 1e3 if seq.first_token_at else -1.0
        logger.info("finish rid=%s reason=%s prompt=%d completion=%d ttft=%.1fms", seq.rid,
                    reason["type"], seq.prompt_len, len(seq.output_ids), ttft_ms)

    def emit(self, seq: Sequence) -> None:
        """Send the unsent ids/text as one chunk: always when final, else every
        ``stream_interval`` tokens (the first token at once)."""
        final = seq.finish_reason is not None
        unsent = len(seq.output_ids) - seq.num_sent_ids
        if not final:
            if not seq.stream:
                return
            interval = seq.params.stream_interval or self._stream_interval
            if seq.num_sent_ids > 0 and unsent < interval:
                return
        ids = seq.output_ids[seq.num_sent_ids:]
        text, seq.unsent_text = seq.unsent_text, ""
        chunk = build_chunk(seq, self.tokenizer is not None, ids, text)
        if seq.return_logprob:
            chunk["meta_info"].update(meta_fields(
                seq.out_logprobs[seq.num_sent_ids:len(seq.output_ids)], ids,
                seq.top_logprobs_num))
            if final and seq.wants_prompt_logprobs and seq.finish_reason["type"] != "abort":
                # as SGLang: whole, on the final chunk
                chunk["meta_info"].update(input_meta_fields(
                    seq.input_ids, seq.logprob_start_len, seq.in_logprobs, seq.top_logprobs_num))
        seq.num_sent_ids = len(seq.output_ids)
        seq.sink(chunk, final)


def build_chunk(seq: Sequence, with_text: bool, output_ids: list[int], text: str
                ) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": seq.rid,
        "finish_reason": seq.finish_reason,
        "prompt_tokens": seq.prompt_len,
        "completion_tokens": len(seq.output_ids),
        "cached_tokens": seq.cached_tokens,
    }
    if seq.finish_reason is not None:
        meta["e2e_latency"] = time.perf_counter() - seq.created_at
    chunk: dict[str, Any] = {"output_ids": output_ids, "meta_info": meta}
    if with_text:
        chunk["text"] = text
    return chunk


def _grammar_finish(grammar: RequestGrammar, token: int) -> FinishReason | None:
    """Advance the matcher; a finished grammar ends the request as SGLang's does."""
    if not grammar.accept(token):  # the mask allowed only what it accepts
        return finish_abort(f"token {token} broke the request's grammar", 500)
    return finish_stop_token(token) if grammar.terminated else None


def _record_logprobs(rows: list[Sequence], tokens: list, logits: torch.Tensor) -> None:
    """Logprobs of the sampled tokens, for the rows that asked (none asked: no work). In
    prefill mode the first token's entry waits here until the token follows it to decode."""
    want = [i for i, (seq, tok) in enumerate(zip(rows, tokens))
            if seq.return_logprob and not isinstance(tok, SamplingFailed)]
    if not want:
        return
    params = [rows[i].params for i in want]
    entries = token_logprobs(
        logits, want, [1.0 if p.is_greedy else p.temperature for p in params],
        [tokens[i] for i in want], [rows[i].top_logprobs_num for i in want])
    for i, entry in zip(want, entries):
        rows[i].out_logprobs.append(entry)


def _is_stop_str(reason: FinishReason) -> bool:
    return reason["type"] == "stop" and isinstance(reason.get("matched"), str)


def _skip_prefill_draw(seq: Sequence, vocab_size: int) -> None:
    """Advance a seeded generator past the draw the prefill engine made for the first token,
    so seeded sampling gives the same tokens aggregated and disaggregated."""
    gen = seq.sampling.generator if seq.sampling is not None else None
    if gen is not None:
        torch.multinomial(torch.ones(vocab_size), 1, generator=gen)
