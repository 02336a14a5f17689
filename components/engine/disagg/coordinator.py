"""Prefill/decode disaggregation on the engine thread: ties requests to KV-transport rooms.

The scheduler calls this at four points and applies the actions it returns; nothing here calls
back into the scheduler:

- ``check_new`` (admission checks) claims the request's room; ``admit`` (decode mode, pages
  allocated) registers the pages with the prefill's bootstrap server;
- ``after_prefill`` (prefill mode) hands the pages and the first token to the transport, which
  WRITEs them into the decode engine once decode has registered the room;
- ``on_finish``: a request ends for any reason; aborts its room and, if a peer may still write
  into (decode) or read from (prefill) its pages, keeps them until the transport says no
  WRITE can touch them (``transport/transport.py``, "When the engine may free pages");
- ``poll``: transport events become ``Adopt`` (decode: KV arrived, continue from the first
  token), ``Complete`` (prefill: KV delivered, send the single chunk), ``Fail`` and ``Free``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from components.engine.core.request_checks import InvalidRequest, bootstrap_problem
from components.engine.config import DisaggregationMode, EngineConfig
from components.engine.core.sequence import Sequence, Status
from components.engine.core.actions import Action, Adopt, Complete, Fail, Free
from components.engine.disagg.choices import choices_problem, choices_to_wire
from components.engine.disagg.failures import (
    FAILURE_STATUS, FAILURE_STATUS_BY_KIND, INVALID_STATUS, TIMEOUT_STATUS,
)
from components.engine.disagg.transport import (
    KVArrived, KVTransport, RoomReleased, TransferDone, TransferFailed, engine_peering,
)
from components.engine.disagg.transport.prefill_writes import TransferTotals
from components.engine.kv.pool import KVPool, PageRun
from components.engine.output.logprobs import first_from_wire, first_to_wire
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST

logger = logging.getLogger(__name__)

# The transport enforces the configured timeouts; the engine's own deadlines are a backstop.
BACKSTOP_SLACK_S = 5.0
@dataclass
class _Room:
    seq: Sequence
    deadline: float
    first_token: int | None = None  # prefill: sent once the WRITE is done


class DisaggCoordinator:
    def __init__(self, cfg: EngineConfig, pool: KVPool, vocab_size: int) -> None:
        self.role = cfg.disaggregation_mode
        self._cfg = cfg
        self._pool = pool
        self._vocab_size = vocab_size
        self.transport = KVTransport(pool.storage, self.role, cfg.host,
                                     cfg.disaggregation_bootstrap_port, cfg.bootstrap_timeout,
                                     cfg.transfer_timeout, peering=engine_peering(cfg, pool))
        self._claimed: dict[int, Sequence] = {}  # room -> its live request, from admission on
        self._rooms: dict[int, _Room] = {}  # rooms handed to the transport
        # room -> (pages a peer may still write (decode) or read (prefill), backstop deadline)
        self._held: dict[int, tuple[PageRun, float]] = {}

    @property
    def bootstrap_port(self) -> int | None:
        return self.transport.bootstrap_port

    @property
    def transfer_totals(self) -> TransferTotals | None:
        """Prefill: the transport's completed WRITEs; decode: None."""
        return self.transport.transfer_totals

    def has_pending(self) -> bool:
        return bool(self._rooms or self._held) or self.transport.busy

    # ---- scheduler calls --------------------------------------------------------------------
    def check_new(self, seq: Sequence) -> None:
        if _is_fake(seq):
            return
        room = seq.bootstrap.room
        if room in self._claimed or room in self._held:
            raise InvalidRequest(f"bootstrap_room {room} is already in use by another request")
        self._claimed[room] = seq

    def admit(self, seq: Sequence) -> list[Action]:
        """Decode mode, pages allocated (the first ``seq.prefilled`` prompt tokens' K/V copied in
        from this engine's prefix cache): register the rest of them for the room."""
        seq.status = Status.WAITING_KV
        if _is_fake(seq):  # as SGLang's fake receiver: a synthetic first token, stale KV
            more = tuple((self._fake_token(f), None) for f in seq.forks)
            return [Adopt(seq, self._fake_token(seq), choices=more)]
        b = seq.bootstrap
        try:
            runs = self._pool.token_runs(seq.pages, seq.prompt_len, seq.prefilled)
            self.transport.add_decode(b.room, b.host, b.port, runs, seq.rid, seq.prefilled)
        except ValueError as exc:
            return [Fail(seq, str(exc), 400)]
        deadline = time.monotonic() + self._cfg.transfer_timeout + BACKSTOP_SLACK_S
        self._rooms[b.room] = _Room(seq, deadline)
        return []

    def _fake_token(self, seq: Sequence) -> int:
        digest = hashlib.blake2b(seq.rid.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self._vocab_size

    def after_prefill(self, seq: Sequence, first_token: int) -> list[Action]:
        """Prefill mode, prompt forwarded: send its pages and first token to the decode."""
        seq.status = Status.TRANSFERRING
        if _is_fake(seq):  # health check / warmup: no decode will come, nothing to send
            return [Complete(seq, first_token)]
        room = seq.bootstrap.room
        try:
            self.transport.add_prefill(room, self._pool.token_runs(seq.pages, seq.prompt_len),
                                       first_token, seq.rid,
                                       first_to_wire(seq.out_logprobs, seq.return_logprob),
                                       seq.cached_tokens, choices_to_wire(seq), seq.prompt_len)
        except ValueError as exc:
            return [Fail(seq, f"KV transfer not started: {exc}", FAILURE_STATUS)]
        deadline = (time.monotonic() + self._cfg.bootstrap_timeout + self._cfg.transfer_timeout
                    + BACKSTOP_SLACK_S)
        self._rooms[room] = _Room(seq, deadline, first_token)
        return []

    def on_finish(self, seq: Sequence, prev: Status) -> bool:
        """``seq`` ends (its reason is set). -> True if its pages are now held here."""
        if seq.bootstrap is None or _is_fake(seq):
            return False
        room = seq.bootstrap.room
        if self._claimed.get(room, seq) is not seq:
            return False  # rejected as a duplicate of a live room: not ours to touch
        self._claimed.pop(room, None)
        message = seq.finish_reason.get("message") or "Aborted"
        invalid = seq.finish_reason.get("status_code") == INVALID_STATUS
        entry = self._rooms.get(room)
        if entry is not None and entry.seq is seq:
            del self._rooms[room]
            self.transport.abort(room, message, invalid)
            if seq.pages is not None:  # keep them until the transport reports the room settled
                self._hold(room, seq.pages)
                return True
        elif prev in (Status.WAITING, Status.PREFILLING) and room not in self._held:
            self._abort_unstarted(seq, message, invalid)
        return False

    def _abort_unstarted(self, seq: Sequence, message: str, invalid: bool) -> None:
        """The request ends before its room reached the transport (rejected or cancelled while
        queued): the peer engine must not wait for it until its own timeout."""
        if bootstrap_problem(seq.bootstrap) is not None:
            return  # nothing reachable to tell
        b = seq.bootstrap
        if self.role == DisaggregationMode.PREFILL:  # a decode may have registered the room
            self.transport.abort(b.room, message, invalid)
        else:  # the prefill may have computed, or be computing, the room's KV
            self.transport.abort_unregistered(b.room, b.host, b.port, message)

    def poll(self, timeout_s: float) -> list[Action]:
        actions: list[Action] = []
        for event in self.transport.poll(timeout_s):
            if isinstance(event, KVArrived):
                actions += self._on_arrived(event)
            elif isinstance(event, TransferDone):
                actions += self._on_done(event.room)
            elif isinstance(event, TransferFailed):
                actions += self._on_failed(event)
            elif isinstance(event, RoomReleased):
                actions += self._release(event.room)
        return actions + self._check_deadlines(time.monotonic())

    def close(self) -> list[Action]:
        """Engine shutdown: no peer can write into a closed agent's memory; free everything."""
        self.transport.close()
        return [a for room in list(self._held) for a in self._release(room)]

    # ---- transport events -------------------------------------------------------------------
    def _on_arrived(self, ev: KVArrived) -> list[Action]:
        entry = self._rooms.pop(ev.room, None)
        if entry is None:
            logger.warning("room %s: KV arrived for no waiting request", ev.room)
            return []
        if not 0 <= ev.first_token < self._vocab_size:
            return [Fail(entry.seq, f"prefill sent first token {ev.first_token} outside the "
                         "vocabulary", FAILURE_STATUS)]
        if entry.seq.return_logprob and ev.logprob is None:
            return [Fail(entry.seq, "prefill sent no logprobs for the first token (was it asked "
                         "for them?)", FAILURE_STATUS)]
        problem = choices_problem(entry.seq, ev.choices, self._vocab_size)
        if problem is not None:
            return [Fail(entry.seq, problem, FAILURE_STATUS)]
        # As SGLang's decode: its usage reports the prefill's cache hit (this engine has none).
        entry.seq.cached_tokens = min(ev.cached_tokens, entry.seq.prompt_len)
        return [Adopt(entry.seq, ev.first_token, first_from_wire(ev.logprob),
                      tuple((c.token, first_from_wire(c.logprob)) for c in ev.choices))]

    def _on_done(self, room: int) -> list[Action]:
        entry = self._rooms.pop(room, None)
        if entry is None:  # aborted meanwhile; the WRITE finished anyway: pages are free now
            return self._release(room)
        return [Complete(entry.seq, entry.first_token)]

    def _on_failed(self, ev: TransferFailed) -> list[Action]:
        entry = self._rooms.pop(ev.room, None)
        if entry is None:
            return self._release(ev.room) if self.role == DisaggregationMode.PREFILL else []
        if self.role == DisaggregationMode.DECODE:  # RoomReleased follows: hold pages till then
            self._hold(ev.room, entry.seq.pages)
            entry.seq.pages = None
        return [Fail(entry.seq, ev.message, FAILURE_STATUS_BY_KIND[ev.kind])]

    def _check_deadlines(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for room, entry in list(self._rooms.items()):
            if now > entry.deadline:
                logger.warning("room %s (rid %s): engine backstop deadline passed", room,
                               entry.seq.rid)
                actions.append(Fail(entry.seq, f"timed out waiting for the KV transfer of room "
                                    f"{room}", TIMEOUT_STATUS))
        for room, (_, until) in list(self._held.items()):
            if now > until:
                logger.error("room %s: transport never settled the room; freeing its pages", room)
                actions += self._release(room)
        return actions

    # ---- pages ------------------------------------------------------------------------------
    def _hold(self, room: int, pages: PageRun) -> None:
        grace = 2 * (self._cfg.bootstrap_timeout + self._cfg.transfer_timeout) + BACKSTOP_SLACK_S
        self._held[room] = (pages, time.monotonic() + grace)

    def _release(self, room: int) -> list[Action]:
        held = self._held.pop(room, None)
        return [Free(held[0])] if held is not None else []


def _is_fake(seq: Sequence) -> bool:
    return seq.bootstrap is not None and seq.bootstrap.host == FAKE_BOOTSTRAP_HOST
