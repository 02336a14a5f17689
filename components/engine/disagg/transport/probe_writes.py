"""Prefill side of the KV path probe (``path_probe.py``): WRITE the pattern into the slot a decode
named, with the probe's notification, and answer ``Probed`` when NIXL says DONE or ERR.

The slot must lie in the probe buffer the decode's Hello declared; a prefill keeps at most
MAX_PROBE_WRITES probes in flight (more are answered with a failure, never queued), and gives
a WRITE up after PROBE_TIMEOUT_S (the decode has given up on it by then).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from components.engine.disagg.transport.bootstrap import BootstrapServer
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.path_probe import PROBE_TIMEOUT_S
from components.engine.disagg.transport.peers import Peer
from protocol.kv_side_channel import PROBE_BYTES, PROBE_SLOTS, KVNotif, Probe, Probed, encode

logger = logging.getLogger(__name__)

MAX_PROBE_WRITES = 4 * PROBE_SLOTS


@dataclass
class _ProbeWrite:
    identity: bytes
    peer: str
    nonce: int
    handle: object
    started: float


class ProbeWrites:
    def __init__(self, nixl: NixlEndpoint, server: BootstrapServer) -> None:
        self._nixl = nixl
        self._server = server
        self._writes: list[_ProbeWrite] = []

    @property
    def busy(self) -> bool:
        return bool(self._writes)

    def started_since(self) -> float | None:
        return max((w.started for w in self._writes), default=None)

    def next_deadline(self) -> float | None:
        return min((w.started + PROBE_TIMEOUT_S for w in self._writes), default=None)

    def on_probe(self, identity: bytes, peer: Peer, msg: Probe) -> None:
        if not peer.probe_base:
            self._answer(identity, msg.nonce, "the decode's Hello declared no probe buffer")
            return
        if len(self._writes) >= MAX_PROBE_WRITES:
            self._answer(identity, msg.nonce, f"{MAX_PROBE_WRITES} probes already in flight")
            return
        dst = peer.probe_base + msg.slot * PROBE_BYTES
        notif = encode(KVNotif(room=msg.nonce, first_token=0))
        try:
            handle, state = self._nixl.write(peer.name, [(self._nixl.probe_base, PROBE_BYTES)],
                                             [(dst, PROBE_BYTES)], notif)
        except (ValueError, *self._nixl.errors) as exc:
            logger.warning("KV path probe from decode agent %s: NIXL could not post the WRITE: "
                           "%s", peer.name, exc)
            self._answer(identity, msg.nonce, f"NIXL could not post the WRITE: {exc}")
            return
        w = _ProbeWrite(identity, peer.name, msg.nonce, handle, time.monotonic())
        self._writes.append(w)
        self._settle(w, state, w.started)

    def progress(self, now: float) -> None:
        for w in list(self._writes):
            self._settle(w, self._nixl.state(w.handle), now)

    def _settle(self, w: _ProbeWrite, state: str, now: float) -> None:
        if state == "DONE":
            logger.info("KV path probe to decode agent %s: WRITE done in %.1f ms", w.peer,
                        (now - w.started) * 1e3)
            self._end(w, "")
        elif state not in ("PROC", "DONE"):
            logger.warning("KV path probe to decode agent %s: the WRITE failed (NIXL %s)",
                           w.peer, state)
            self._end(w, f"the WRITE failed (NIXL state {state})")
        elif now - w.started > PROBE_TIMEOUT_S:
            logger.warning("KV path probe to decode agent %s: the WRITE is still in flight after "
                           "%g s; giving it up", w.peer, PROBE_TIMEOUT_S)
            self._end(w, f"the WRITE was still in flight after {PROBE_TIMEOUT_S:g} s")

    def _end(self, w: _ProbeWrite, reason: str) -> None:
        self._writes.remove(w)
        self._nixl.release(w.handle)
        self._answer(w.identity, w.nonce, reason)

    def _answer(self, identity: bytes, nonce: int, reason: str) -> None:
        self._server.send(identity, Probed(nonce, self._nixl.name, reason))

    def close(self) -> None:
        for w in self._writes:
            self._nixl.release(w.handle)
        self._writes.clear()
