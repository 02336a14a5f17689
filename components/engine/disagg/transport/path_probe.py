"""The KV path probe: one small real transfer before a decode's rooms use a prefill.

A side channel that works says nothing about the KV path: NIXL's WRITE and its notification go
through UCX on their own transports (``nixl_endpoint.py``), and a path that drops either (a
notification that never reaches a decode in another network namespace, a UCX_TLS the hosts do
not share) used to show only as every request waiting out its transfer timeout.

Decode: the first room for a prefill starts a probe. The decode zeroes a slot of its probe
buffer (declared in its Hello) and sends ``Probe`` on its side channel; the room's ``Register``
waits. The prefill WRITEs the known pattern into the slot, with a notification whose ``room`` is
the probe's nonce, and answers ``Probed`` (or says why the WRITE failed). The path is good once
the notification has come from the agent the prefill's Welcome named and the slot holds the
pattern: the waiting Registers go out. Otherwise, when the prefill reports a failure or after
PROBE_TIMEOUT_S, it is broken: the waiting rooms fail at once (a 503 naming the prefill, what did
not arrive and the UCX settings), and so does every new room for that prefill for PROBE_RETRY_S;
the next room after that probes again. A dropped connection forgets the verdict, so a restarted
prefill is probed anew.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass

from components.engine.disagg.transport.nixl_endpoint import (
    ADAPTIVE_PROGRESS_ENV, NixlEndpoint, probe_pattern,
)
from protocol.kv_side_channel import PROBE_BYTES, PROBE_SLOTS, KVNotif, Probe, Probed
from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0  # for the data and the notification to arrive
PROBE_RETRY_S = 10.0  # a broken path fails new rooms at once this long, then is probed again
# "0": no probe (only for showing the per-room bounds of a path that loses notifications).
PROBE_ENV = "DYN_KV_PATH_PROBE"

Endpoint = tuple[str, int]


def probe_enabled() -> bool:
    return os.environ.get(PROBE_ENV, "1") != "0"


def ucx_settings() -> str:
    names = ("UCX_TLS", "UCX_NET_DEVICES")
    given = [f"{n}={os.environ[n]}" for n in names if n in os.environ] or ["no UCX_* set"]
    return ", ".join([*given, f"ADAPTIVE_PROGRESS={os.environ.get(ADAPTIVE_PROGRESS_ENV, 'n')}"])


def broken_message(endpoint: Endpoint, agent: str | None, what: str) -> str:
    return (f"the KV path from prefill {endpoint[0]}:{endpoint[1]} (NIXL agent {agent!r}) to "
            f"this decode failed its check: {what}. KV moves by NIXL over UCX ({ucx_settings()}):"
            " between hosts both workers need a transport they share (UCX_TLS unset or naming "
            "tcp or an RDMA device both have, UCX_NET_DEVICES an interface that reaches the "
            f"other host); between network namespaces of one host leave {ADAPTIVE_PROGRESS_ENV}"
            " unset; UCX_PROTO_INFO=y prints the transport taken. Rooms for this prefill fail "
            f"at once for {PROBE_RETRY_S:g} s, then it is probed again")


@dataclass
class _Path:
    nonce: int
    slot: int
    deadline: float
    started: float
    prefill_done: bool = False  # its ``Probed`` said the WRITE is DONE
    notified_by: str | None = None  # the agent whose probe notification arrived
    failure: str | None = None  # set once broken
    retry_at: float = 0.0


class DecodeProbes:
    """Per prefill endpoint: probing, good, or broken (with why); the decode side asks first."""

    def __init__(self, nixl: NixlEndpoint, send, enabled: bool = True) -> None:
        self._nixl = nixl
        self._send = send  # (endpoint, message) -> bool, the side channel
        self._enabled = enabled
        self._paths: dict[Endpoint, _Path] = {}
        self._good: set[Endpoint] = set()
        self._free = list(range(PROBE_SLOTS))
        self._decided: list[tuple[Endpoint, bool]] = []

    def status(self, endpoint: Endpoint, now: float) -> str:
        """"good", "probing" (a probe is under way: hold the room's Register) or "broken"."""
        if not self._enabled or endpoint in self._good:
            return "good"
        path = self._paths.get(endpoint)
        if path is not None and path.failure is not None and now >= path.retry_at:
            self.forget(endpoint)
            path = None
        if path is None:
            return self._start(endpoint, now)
        return "broken" if path.failure is not None else "probing"

    def failure(self, endpoint: Endpoint) -> str:
        path = self._paths.get(endpoint)
        return path.failure if path is not None and path.failure else "the KV path is unchecked"

    def _start(self, endpoint: Endpoint, now: float) -> str:
        if not self._free:  # as many prefills probed at once as there are slots: skip it
            logger.warning("KV path to prefill %s:%s not probed: %d probes already under way",
                           *endpoint, PROBE_SLOTS)
            self._good.add(endpoint)
            return "good"
        slot = self._free.pop()
        self._nixl.probe[slot * PROBE_BYTES:(slot + 1) * PROBE_BYTES].zero_()
        nonce = random.randint(MIN_BOOTSTRAP_ROOM, MAX_BOOTSTRAP_ROOM)
        # Judged from the prefill's Welcome on: until then the rooms' own timeouts apply.
        self._paths[endpoint] = _Path(nonce, slot, math.inf, now)
        if not self._send(endpoint, Probe(nonce, self._nixl.name, slot)):
            self._break(endpoint, "the probe could not be sent on the side channel", now)
            self._decided.pop()  # the caller learns it from the answer
            return "broken"
        return "probing"

    def on_probed(self, endpoint: Endpoint, msg: Probed) -> None:
        path = self._paths.get(endpoint)
        if path is None or path.nonce != msg.nonce or path.failure is not None:
            return
        if msg.reason:
            self._break(endpoint, f"the prefill's probe WRITE failed: {msg.reason}",
                        time.monotonic(), msg.agent_name)
        else:
            path.prefill_done = True

    def on_welcome(self, endpoint: Endpoint, now: float) -> None:
        """The prefill has our metadata now: the probe's WRITE must arrive within the bound."""
        path = self._paths.get(endpoint)
        if path is not None and path.failure is None and path.deadline == math.inf:
            path.deadline = now + PROBE_TIMEOUT_S

    def on_notif(self, agent: str, notif: KVNotif) -> bool:
        """True if ``notif`` is a probe's (consumed here)."""
        for path in self._paths.values():
            if path.nonce == notif.room and path.failure is None:
                path.notified_by = agent
                return True
        return False

    def settle(self, now: float, owners: dict[Endpoint, str]) -> list[tuple[Endpoint, bool]]:
        """The paths decided since the last call: (endpoint, good). ``owners``: each prefill's
        agent from its Welcome (a notification counts only from it)."""
        for endpoint, path in list(self._paths.items()):
            if path.failure is not None:
                continue
            owner = owners.get(endpoint)
            if owner is not None and path.notified_by == owner and self._landed(path):
                logger.info("KV path from prefill %s:%s checked: data and notification arrived "
                            "in %.1f ms", *endpoint, (now - path.started) * 1e3)
                self._free.append(path.slot)
                del self._paths[endpoint]
                self._good.add(endpoint)
                self._decided.append((endpoint, True))
            elif now >= path.deadline:
                self._break(endpoint, self._missing(path, owner), now, owner)
        decided, self._decided = self._decided, []
        return decided

    def _landed(self, path: _Path) -> bool:
        got = self._nixl.probe[path.slot * PROBE_BYTES:(path.slot + 1) * PROBE_BYTES]
        return bytes(got.numpy()) == probe_pattern()

    def _missing(self, path: _Path, owner: str | None) -> str:
        wait = f"within {PROBE_TIMEOUT_S:g} s of the prefill's Welcome"
        if path.notified_by is None and path.prefill_done:
            return (f"the prefill's probe WRITE is DONE, but its NIXL notification (a UCX active "
                    f"message) never arrived {wait}")
        if path.notified_by is None:
            return f"neither the probe's data nor its notification arrived {wait}"
        if path.notified_by != owner:
            return f"the probe's notification came from agent {path.notified_by!r}, not {owner!r}"
        return f"the probe's notification arrived but its data did not {wait}"

    def _break(self, endpoint: Endpoint, what: str, now: float,
               owner: str | None = None) -> None:
        path = self._paths[endpoint]
        path.failure = broken_message(endpoint, owner, what)
        path.retry_at = now + PROBE_RETRY_S
        self._free.append(path.slot)
        path.slot = -1
        self._decided.append((endpoint, False))
        logger.warning("%s", path.failure)

    def abandon(self, endpoint: Endpoint) -> None:
        """No room waits for ``endpoint`` any more: drop a probe still under way (the next room
        starts another); a broken verdict stays until its retry time."""
        path = self._paths.get(endpoint)
        if path is not None and path.failure is None:
            self.forget(endpoint)

    def forget(self, endpoint: Endpoint) -> None:
        """The prefill's connection dropped (or its verdict expired): probe it anew next time."""
        self._good.discard(endpoint)
        path = self._paths.pop(endpoint, None)
        if path is not None and path.slot >= 0:
            self._free.append(path.slot)

    def probing_since(self) -> float | None:
        return max((p.started for p in self._paths.values() if p.failure is None), default=None)

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._paths.values()
                    if p.failure is None and p.deadline < math.inf), default=None)
