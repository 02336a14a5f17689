"""Prefill/decode disaggregation on the engine thread: ties requests to KV-transport rooms.

Prefill mode: after the prefill forward, the request's pages and first token go to the
transport, which WRITEs them into the decode engine once decode has registered the room. The
request yields its single chunk (SGLang's prefill shape) when the transfer is done.
Decode mode: the request's pages are registered with the prefill's bootstrap server; when the
KV and first token arrive, the request joins the decode batch and streams from that token.

Pages a peer might still be writing are never reused: they stay held until the transport
says no WRITE can touch them any more (kv_transfer.py, "When the engine may free pages").
"""

from __future__ import annotations

import hashlib
import logging
import time

import torch

from components.engine import outputs
from components.engine.config import EngineConfig
from components.engine.kv_pool import KVPool, PageRun
from components.engine.kv_transfer import (
    KVArrived, KVTransport, RoomReleased, TransferDone, TransferFailed,
)
from components.engine.request_checks import FAKE_BOOTSTRAP_HOST, RequestError
from components.engine.sequence import Sequence, Status

logger = logging.getLogger(__name__)

# The transport enforces the configured timeouts; the engine's own deadlines are a backstop.
BACKSTOP_SLACK_S = 5.0
TIMEOUT_STATUS = 504
FAILURE_STATUS = 500


class DisaggCoordinator:
    def __init__(self, cfg: EngineConfig, sched, pool: KVPool) -> None:
        self.role = cfg.disaggregation_mode
        self._cfg = cfg
        self._sched = sched
        self._pool = pool
        self.transport = KVTransport(pool.tensor, self.role, cfg.host,
                                     cfg.disaggregation_bootstrap_port, cfg.bootstrap_timeout,
                                     cfg.transfer_timeout)
        self._rooms: dict[int, Sequence] = {}
        # room -> (pages a peer may still write (decode) or read (prefill), backstop deadline)
        self._held: dict[int, tuple[PageRun, float]] = {}

    @property
    def bootstrap_port(self) -> int | None:
        return self.transport.bootstrap_port

    def has_pending(self) -> bool:
        return bool(self._rooms or self._held) or self.transport.busy

    # ---- requests ---------------------------------------------------------------------------
    def check_new(self, seq: Sequence) -> None:
        if _is_fake(seq):
            return
        room = seq.bootstrap.room
        if room in self._rooms or room in self._held or any(
                s.bootstrap.room == room for s in self._sched.waiting):
            raise RequestError(f"bootstrap_room {room} is already in use by another request")

    def start_prefill(self, seq: Sequence, first_token: int) -> None:
        seq.prefill_token = first_token
        seq.status = Status.TRANSFERRING
        if _is_fake(seq):  # health check / warmup: no decode will come, nothing to send
            self._complete_prefill(seq)
            return
        room = seq.bootstrap.room
        try:
            self.transport.add_prefill(room, self._pool.token_runs(seq.pages, seq.prompt_len),
                                       first_token, seq.rid)
        except ValueError as exc:
            self._sched.finish(seq, outputs.finish_abort(f"KV transfer not started: {exc}",
                                                         FAILURE_STATUS))
            return
        self._rooms[room] = seq
        seq.deadline = (time.monotonic() + self._cfg.bootstrap_timeout
                        + self._cfg.transfer_timeout + BACKSTOP_SLACK_S)

    def start_decode(self, seq: Sequence) -> None:
        seq.status = Status.WAITING_KV
        if _is_fake(seq):  # as SGLang's fake receiver: a synthetic first token, stale KV
            digest = hashlib.blake2b(seq.rid.encode(), digest_size=8).digest()
            self._adopt(seq, int.from_bytes(digest, "little") % self._sched.limits.vocab_size)
            return
        b = seq.bootstrap
        try:
            self.transport.add_decode(b.room, b.host, b.port,
                                      self._pool.token_runs(seq.pages, seq.prompt_len), seq.rid)
        except ValueError as exc:
            self._sched.finish(seq, outputs.finish_abort(str(exc), 400))
            return
        self._rooms[b.room] = seq
        seq.deadline = time.monotonic() + self._cfg.transfer_timeout + BACKSTOP_SLACK_S

    def forget(self, seq: Sequence, prev: Status) -> None:
        """``seq`` is finishing for a reason of its own (abort, shutdown, deadline, error)."""
        if seq.bootstrap is None or _is_fake(seq):
            return
        room = seq.bootstrap.room
        owner = self._rooms.get(room)
        if owner is seq:
            del self._rooms[room]
            self.transport.abort(room, seq.finish_reason.get("message") or "Aborted")
            if seq.pages is not None:  # keep them until the transport reports the room settled
                self._hold(room, seq)
        elif (self.role == "prefill" and prev is Status.WAITING and owner is None
              and _valid_room(room) and room not in self._held
              and not any(s.bootstrap.room == room for s in self._sched.waiting if s is not seq)):
            # Never reached the transport: tell a decode that registered it not to wait.
            self.transport.abort(room, seq.finish_reason.get("message") or "Aborted")

    # ---- transport events -------------------------------------------------------------------
    def poll(self, timeout_s: float) -> None:
        for event in self.transport.poll(timeout_s):
            if isinstance(event, KVArrived):
                self._on_arrived(event)
            elif isinstance(event, TransferDone):
                self._on_done(event.room)
            elif isinstance(event, TransferFailed):
                self._on_failed(event)
            elif isinstance(event, RoomReleased):
                self._release(event.room)
        self._check_deadlines(time.monotonic())

    def _on_arrived(self, ev: KVArrived) -> None:
        seq = self._rooms.pop(ev.room, None)
        if seq is None:
            logger.warning("room %s: KV arrived for no waiting request", ev.room)
            return
        if not 0 <= ev.first_token < self._sched.limits.vocab_size:
            self._sched.finish(seq, outputs.finish_abort(
                f"prefill sent first token {ev.first_token} outside the vocabulary",
                FAILURE_STATUS))
            return
        self._adopt(seq, ev.first_token)

    def _adopt(self, seq: Sequence, first_token: int) -> None:
        """Decode: the KV is in place; the request joins the batch, streaming the first token."""
        _skip_prefill_draw(seq, self._sched.limits.vocab_size)
        seq.status = Status.RUNNING
        self._sched.running.append(seq)
        self._sched.on_token(seq, first_token)

    def _on_done(self, room: int) -> None:
        seq = self._rooms.pop(room, None)
        if seq is None:  # aborted meanwhile; the WRITE finished anyway: pages are free now
            self._release(room)
            return
        self._complete_prefill(seq)

    def _complete_prefill(self, seq: Sequence) -> None:
        """Prefill: SGLang's single chunk, the first token with finish_reason length 0."""
        seq.output_ids.append(seq.prefill_token)
        if seq.detok is not None:
            seq.unsent_text += seq.detok.add(seq.prefill_token)
        self._sched.finish(seq, outputs.finish_length(0))

    def _on_failed(self, ev: TransferFailed) -> None:
        seq = self._rooms.pop(ev.room, None)
        if self.role == "prefill":
            if seq is None:
                self._release(ev.room)
            else:  # no WRITE in flight: the scheduler frees the pages with the request
                self._sched.finish(seq, outputs.finish_abort(ev.message, _status_for(ev.message)))
        elif seq is not None:  # decode: RoomReleased follows; hold the pages until then
            self._hold(ev.room, seq)
            self._sched.finish(seq, outputs.finish_abort(ev.message, _status_for(ev.message)))

    def _check_deadlines(self, now: float) -> None:
        for room, seq in list(self._rooms.items()):
            if seq.deadline is not None and now > seq.deadline:
                logger.warning("room %s (rid %s): engine backstop deadline passed", room, seq.rid)
                self._sched.finish(seq, outputs.finish_abort(
                    f"timed out waiting for the KV transfer of room {room}", TIMEOUT_STATUS))
        for room, (_, until) in list(self._held.items()):
            if now > until:
                logger.error("room %s: transport never settled the room; freeing its pages", room)
                self._release(room)

    # ---- pages ------------------------------------------------------------------------------
    def _hold(self, room: int, seq: Sequence) -> None:
        pages, seq.pages = seq.pages, None
        grace = 2 * (self._cfg.bootstrap_timeout + self._cfg.transfer_timeout) + BACKSTOP_SLACK_S
        self._held[room] = (pages, time.monotonic() + grace)

    def _release(self, room: int) -> None:
        held = self._held.pop(room, None)
        if held is not None:
            self._sched.release_pages(held[0])

    def close(self) -> None:
        """Engine shutdown: no peer can write into a closed agent's memory; free everything."""
        self.transport.close()
        for room in list(self._held):
            self._release(room)


def _is_fake(seq: Sequence) -> bool:
    return seq.bootstrap is not None and seq.bootstrap.host == FAKE_BOOTSTRAP_HOST


def _valid_room(room: object) -> bool:
    return type(room) is int and 1 <= room < 2**63


def _status_for(message: str) -> int:
    return TIMEOUT_STATUS if "timed out" in message else FAILURE_STATUS


def _skip_prefill_draw(seq: Sequence, vocab_size: int) -> None:
    """Advance a seeded generator past the draw the prefill engine made for the first token,
    so seeded sampling gives the same tokens aggregated and disaggregated."""
    gen = seq.sampling.generator if seq.sampling is not None else None
    if gen is not None:
        torch.multinomial(torch.ones(vocab_size), 1, generator=gen)
