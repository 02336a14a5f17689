"""Parallel sampling (``n > 1``): the prompt is prefilled once and forked into ``n`` choices.

SGLang's TokenizerManager runs a request with ``n > 1`` as ``n`` sub-requests under fresh rids
(after a warm-up request that puts the prompt in its radix cache) and tags each chunk with the
choice's ``index``. Here the choices are ``n`` Sequences from the start, with fresh rids too:
choice 0 (the leader) is queued and prefilled; the others ride on it (``leader.forks``). The
group is admitted as one, with pages for every choice. The forward that completes the
leader's prompt gives one logits row, which every choice samples from with its own sampler
state; then the prompt's K/V is copied into each choice's pages (one memcpy per choice, so each
request keeps one contiguous run, as with the prefix cache) and the choices decode as
independent rows. A choice aborted or finished early frees only its own pages; a leader that
ends before its prompt is prefilled ends the choices waiting on it the same way.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import torch

from components.engine.kv.pool import KVPool, PageRun
from components.engine.core.sequence import Sequence, Status


def make_choices(leader: Sequence, n: int) -> list[Sequence]:
    """Turn ``leader`` into choice 0 of ``n`` (fresh rids, as SGLang's sub-requests get) and
    return all ``n``; the caller's rid stays as ``parent_rid``."""
    parent = leader.rid
    leader.rid, leader.index, leader.parent_rid = uuid.uuid4().hex, 0, parent
    leader.forks = [
        # The ids come from the leader once it is checked (and tokenized): share_plan.
        Sequence(rid=uuid.uuid4().hex, params=leader.params, sink=leader.sink,
                 stream=leader.stream, index=i, parent_rid=parent,
                 return_logprob=leader.return_logprob, top_logprobs_num=leader.top_logprobs_num,
                 # prompt logprobs: the leader's forward fills the one shared list
                 logprob_start_len=leader.logprob_start_len, in_logprobs=leader.in_logprobs)
        for i in range(1, n)
    ]
    return [leader, *leader.forks]


def pending(leader: Sequence) -> list[Sequence]:
    """The choices still waiting for the leader's prompt KV."""
    return [f for f in leader.forks if not f.finished]


def share_plan(leader: Sequence) -> None:
    """After the leader passed the admission checks: the choices get its ids and budget."""
    for f in leader.forks:
        f.input_ids = leader.input_ids
        f.max_new_tokens, f.reserve_tokens = leader.max_new_tokens, leader.reserve_tokens


def allocate_group(leader: Sequence, allocate: Callable[[int], PageRun | None],
                   release: Callable[[PageRun | None], None], page_size: int) -> bool:
    """Pages for the request and each of its waiting choices, all or none."""
    rows = [leader, *pending(leader)]
    runs = [allocate(row.reserve_tokens) for row in rows]
    if None in runs:
        for run in runs:
            release(run)
        return False
    for row, pages in zip(rows, runs):
        row.attach_pages(pages, page_size)
    for fork in rows[1:]:
        fork.status = Status.PREFILLING  # its prompt K/V comes from the leader's forward
    return True


def group_rows(seq: Sequence) -> int:
    """Rows a queued request will run as."""
    return 1 + len(pending(seq))


def expand(rows: list[Sequence], logits: torch.Tensor
           ) -> tuple[list[Sequence], torch.Tensor]:
    """Add each waiting choice after its leader, on a copy of the leader's logits row (the
    sampler changes rows in place)."""
    if not any(s.forks for s in rows):
        return rows, logits
    out_rows: list[Sequence] = []
    picks: list[int] = []
    for i, seq in enumerate(rows):
        group = [seq, *pending(seq)] if seq.status is Status.PREFILLING else [seq]
        out_rows += group
        picks += [i] * len(group)
    return out_rows, logits.index_select(0, torch.tensor(picks, dtype=torch.long))


def fork_kv(pool: KVPool, leader: Sequence) -> None:
    """Copy the leader's prompt K/V into each waiting choice's pages; they are prefilled now."""
    n = leader.prompt_len
    kv = pool.tensor
    src = kv[:, :, :, leader.start_tok:leader.start_tok + n]
    for f in pending(leader):
        kv[:, :, :, f.start_tok:f.start_tok + n].copy_(src)
        f.prefilled, f.cached_tokens = n, leader.cached_tokens
    leader.forks = []


def choice_seed(seed: int | None, index: int | None) -> int | None:
    """The seed of choice ``index``'s sampler: the request's seed plus the choice index (vLLM's
    convention), so seeded choices differ from each other and the request is reproducible."""
    if seed is None or not index:
        return seed
    return seed + index


def adopt_group(pool: KVPool, leader: Sequence) -> list[Sequence]:
    """Decode mode, the prompt's KV arrived in the leader's pages: copy it into each waiting
    choice's pages, as after an aggregated prefill. -> the choices that adopt it, leader first."""
    forks = pending(leader)
    if forks:
        fork_kv(pool, leader)
    return [leader, *forks]


def strip_index(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Non-streaming n > 1: SGLang returns the choices' final outputs as a list in index order,
    without ``index``."""
    ordered = sorted(chunks, key=lambda c: c["index"])
    return [{k: v for k, v in c.items() if k != "index"} for c in ordered]
