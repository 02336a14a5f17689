"""The CPU engine's prefill -> decode KV transfer (side channel + NIXL WRITE): what both sides
share (``TransportBase``, here), and the protocol. Each side is its own class,
``PrefillTransport`` (prefill_transport.py) and ``DecodeTransport`` (decode_transport.py);
``KVTransport`` (factory.py) makes the one a role needs.

Created, used and closed on the engine thread only; nothing here blocks longer than the
``poll(timeout_s)`` the engine asks for. Flow (SGLang's NIXL PD protocol in spirit):

- prefill binds the bootstrap server (ZMQ ROUTER, msgpack) on ``tcp://host:bootstrap_port``;
- decode, per room, connects to that server (one DEALER per prefill, ``hello`` with its NIXL
  agent metadata once per peer) and registers the room's destination runs;
- once the prefill has both the room's local KV (``add_prefill``) and the registration, in either
  order, it posts one NIXL WRITE carrying a notification
  ``{room, first_token, logprob?, cached_tokens?}`` (msgpack);
- decode's ``poll`` sees the notification: ``KVArrived``; prefill's ``poll`` sees DONE:
  ``TransferDone``.

Who may speak (``peers.py``, ``auth.py``): the prefill binds each decode agent name to the ZMQ
connection whose Hello introduced it (until that connection drops) and answers ``Welcome`` with
its own agent name, or ``Refused`` with a reason. Only that connection may register rooms for
the name, only inside the pool its Hello declared, and only the connection that registered a
room may abort it. Decode accepts a room's NIXL notification only from the agent named in the
Welcome of the room's connection. The Hello carries the caller's ``KVLayout`` (``Peering``):
unequal layouts are refused, so decode's rooms fail naming both. With a shared secret every
Hello (and Welcome) carries an HMAC; without one (the default) peers are not authenticated,
which is fine only while the bootstrap server is reachable from trusted hosts alone (a WARNING
says so when it binds beyond loopback). Frames over ``MAX_MESSAGE_BYTES`` are dropped before
decoding; every per-peer table is capped (``counters`` shows their sizes).

When the engine may free pages (the contract):

- **prefill**: each ``add_prefill`` room ends with exactly one ``TransferDone`` or
  ``TransferFailed`` (also after ``abort``), emitted only when no WRITE of it is in flight.
  Free the source pages on either.
- **decode**: ``KVArrived`` hands the pages to the request (freed when the request finishes).
  ``TransferFailed`` ends the request but the pages stay reserved: free them on ``RoomReleased``,
  which follows every ``TransferFailed`` and every ``abort(room)`` of a room still pending
  (the prefill acknowledged the abort, aborted itself, its connection dropped, it never
  connected, or ``transfer_timeout`` passed). ``abort`` emits no ``TransferFailed``.
- **both**: a WRITE that timed out but that NIXL will not release may still land. The prefill
  keeps the room (no ``TransferFailed``) and tells decode ``Holding``, so decode's
  ``RoomReleased`` waits for the prefill's ``Abort``/``AbortAck``; both give up after
  ``HOLD_BACKSTOP_FACTOR * transfer_timeout`` with an ERROR.

Interface notes (changes to the task's sketch): source and destination runs need only the same
total size, not the same count (see runs.py); invalid local runs or a duplicate room
raise ValueError at the call; ``bootstrap_port`` None or 0 binds a free port (``.bootstrap_port``);
``peering`` (layout and secret) defaults to none of either, for tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Iterator

import torch
import zmq

from components.engine.disagg.transport.bootstrap import BootstrapServer
from components.engine.disagg.transport.bootstrap_client import BootstrapClient
from components.engine.disagg.transport.decode_side import DecodeSide
from components.engine.disagg.transport.events import Event
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.peering import Peering
from components.engine.disagg.transport.prefill_side import PrefillSide
from components.engine.disagg.transport.prefill_writes import TransferTotals
from components.engine.disagg.transport.runs import Run
from protocol.kv_side_channel import ChoiceFirst, FirstLogprob

__all__ = ["TransportBase", "check_host", "check_timeout"]

logger = logging.getLogger(__name__)

# While NIXL work is pending, wait on ZMQ in 1 ms slices (its finest timeout) between UCX
# progress calls: an arrived notification waits at most one slice for decode to see it (slices
# that grew with the wait, up to 5 ms, could hold it that long).
_SLICE_S = 0.001


def check_timeout(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def check_host(host: str) -> None:
    if not isinstance(host, str) or not host:
        raise ValueError("host must be a non-empty address")


class TransportBase:
    """What both sides share: the NIXL agent, the ZMQ context and poller, the event queue, the
    poll loop and ``abort``/``close``. Each side's class opens its side channel and its room
    logic (``_side``) after this ``__init__``, and names its side channel in ``_channel``."""

    role = ""  # "prefill" or "decode": each side's class says

    def __init__(self, pool: torch.Tensor, agent_name: str | None, peering: Peering) -> None:
        self._events: list[Event] = []
        self._closed = False
        self._side: PrefillSide | DecodeSide | None = None
        name = agent_name or f"{self.role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._nixl = NixlEndpoint(name, pool, peering.ucx_error_handling,
                                  peering.ucx_cma_seg_size)
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()

    @contextlib.contextmanager
    def _closed_on_error(self) -> Iterator[None]:
        """Wrap a side's opening: what was opened before a failure is closed again."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    @property
    def agent_name(self) -> str:
        return self._nixl.name

    @property
    def agent_metadata(self) -> bytes:
        """This NIXL agent's metadata, as a decode's Hello carries it to the prefill."""
        return self._nixl.metadata

    # The prefill's own (its bootstrap server, its WRITEs); a decode has none of them.
    @property
    def bootstrap_port(self) -> int | None:
        return None

    @property
    def bootstrap_connections(self) -> int:
        return 0

    @property
    def counters(self) -> dict[str, int]:
        return {}

    @property
    def transfer_totals(self) -> TransferTotals | None:
        return None

    @property
    def busy(self) -> bool:
        return bool(self._events) or self._side.busy

    # --- engine calls -------------------------------------------------------------------------
    # One side's calls, made on the other side's transport, fail clearly (each side overrides
    # its own): the engine holds a transport of either side.
    def add_prefill(self, room: int, runs: list[Run], first_token: int, rid: str,
                    logprob: FirstLogprob | None = None, cached_tokens: int = 0,
                    choices: tuple[ChoiceFirst, ...] = (), tokens: int = 0) -> None:
        """``tokens``: how many the ``runs`` hold (needed when a decode holds the first ones)."""
        self._wrong_side("add_prefill", "prefill")

    def add_decode(self, room: int, bootstrap_host: str, bootstrap_port: int,
                   runs: list[Run], rid: str, skip: int = 0) -> None:
        """``skip``: the prompt's first tokens the decode already holds; ``runs`` are the rest."""
        self._wrong_side("add_decode", "decode")

    def abort_unregistered(self, room: int, bootstrap_host: str, bootstrap_port: int,
                           message: str = "Aborted") -> None:
        self._wrong_side("abort_unregistered", "decode")

    def abort(self, room: int, message: str = "Aborted", invalid: bool = False) -> None:
        """``invalid`` (prefill): the request itself was refused, the client's error."""
        if not self._closed:
            self._side.abort(int(room), message, invalid)

    def poll(self, timeout_s: float) -> list[Event]:
        """Service the side channel and NIXL; return events, waiting at most ``timeout_s``."""
        if self._closed:
            return []
        end = time.monotonic() + max(0.0, timeout_s)
        while True:
            self._service(0.0 if self._events else self._wait_budget(end))
            self._side.progress(time.monotonic())
            if self._events or time.monotonic() >= end:
                break
        events, self._events[:] = list(self._events), []
        return events

    def close(self) -> None:
        """Idempotent: cancel/release transfers, deregister the pool, close sockets."""
        if self._closed:
            return
        self._closed = True
        if self._side is not None:
            self._side.close()
        channel = self._channel()
        if channel is not None:
            channel.close()
        self._ctx.term()
        self._nixl.close()
        logger.info("KV transport %s closed", self._nixl.name)

    # --- internals ----------------------------------------------------------------------------
    def _channel(self) -> BootstrapServer | BootstrapClient | None:
        """The side channel: the prefill's bootstrap server, or the decode's client of them."""
        raise NotImplementedError

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("the KV transport is closed")

    def _wrong_side(self, call: str, role: str) -> None:
        self._require_open()
        raise RuntimeError(f"{call} needs a {role} transport; this one is {self.role}")

    def _wait_budget(self, end: float) -> float:
        now = time.monotonic()
        wait = end - now
        deadline = self._side.next_deadline()
        if deadline is not None:
            wait = min(wait, deadline - now)
        since = self._side.progress_since()
        if since is not None:
            wait = min(wait, _SLICE_S)
        return max(0.0, wait)

    def _service(self, wait_s: float) -> None:
        if not self._poller.sockets:  # decode with no peer yet: zmq would return at once
            time.sleep(wait_s)
            return
        # zmq takes whole milliseconds; round up so a short wait never becomes a busy spin.
        ready = self._poller.poll(math.ceil(wait_s * 1000) if wait_s > 0 else 0)
        if not ready:
            return
        # Peers are ROUTER identities (prefill) or bootstrap endpoints (decode).
        messages, dropped = self._channel().recv_all()
        for peer, msg in messages:
            self._side.on_message(peer, msg)
        for peer in dropped:
            self._side.on_disconnect(peer)
