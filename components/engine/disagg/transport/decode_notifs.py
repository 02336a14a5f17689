"""The prefill's NIXL notification on the decode side: reading it, whether it counts, and how
long it may take after the prefill's ``Written``.

A notification counts only if it comes from the agent the room's prefill named in its
``Welcome`` (checked with the secret's HMAC when one is set); one that comes before the Welcome
is kept with its room until the Welcome says whether it counts.
"""

from __future__ import annotations

import time

import msgspec

from components.engine.disagg.transport.bootstrap import Endpoint
from components.engine.disagg.transport.decode_room import MAX_EARLY, DecodeRoom
from components.engine.disagg.transport.events import notif_grace
from components.engine.disagg.transport.nixl_endpoint import NixlEndpoint
from components.engine.disagg.transport.peers import Throttle
from protocol.kv_side_channel import MAX_NOTIF_BYTES, KVNotif, notif_decoder


def read_notifs(nixl: NixlEndpoint, throttle: Throttle) -> list[tuple[str, KVNotif]]:
    """The notifications that arrived, as (sending agent, notification); a malformed one is
    dropped with a (throttled) warning."""
    notifs = []
    for agent, raw in nixl.notifs():
        try:
            if len(raw) > MAX_NOTIF_BYTES:
                raise msgspec.DecodeError(f"{len(raw)} bytes is over the limit")
            notifs.append((agent, notif_decoder.decode(raw)))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            throttle.warn("notif", "dropped a malformed NIXL notification from %r: %s",
                          agent, exc)
    return notifs


def counts(r: DecodeRoom, agent: str, notif: KVNotif, owner: str | None,
           throttle: Throttle) -> bool:
    """Whether ``notif`` from ``agent`` ends room ``r``, whose prefill's agent is ``owner``
    (None: its Welcome is still on its way, so the notification waits with the room)."""
    if owner is None:
        if len(r.early) < MAX_EARLY:
            r.early.append((agent, notif))
        return False
    if agent != owner:
        throttle.warn("notif-agent", "room %s: ignored a KV notification from agent %r; "
                      "the room's prefill is %r", r.room, agent, owner)
        return False
    return True


def note_written(r: DecodeRoom | None, endpoint: Endpoint, transfer_timeout: float) -> None:
    """The prefill of room ``r`` said its WRITE is done (``Written``): a wake-up, the poll's
    progress() right after reads the notification. Should it never come (a transport that
    cannot deliver it), the room fails ``notif_grace`` after this."""
    if r is not None and r.endpoint == endpoint and not r.releasing and not r.written:
        r.written = time.monotonic()
        r.deadline = min(r.deadline, r.written + notif_grace(transfer_timeout))
