"""Events ``KVTransport.poll()`` returns (transport.py says when the engine frees pages)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocol.kv_side_channel import ChoiceFirst, FirstLogprob


class FailureKind(enum.Enum):
    """Why a room failed; the coordinator's one table maps each kind to what the client sees."""

    TIMED_OUT = "timed out"  # a timeout ran out (here, or at the peer that gave the room up)
    PEER_LOST = "peer lost"  # the side channel to the peer dropped or could not be opened
    REFUSED = "refused"  # the peer refused this side (handshake), or the prefill evicted it
    NIXL_ERROR = "NIXL error"  # the WRITE failed, or could not be posted
    ABORTED = "aborted"  # the engine or the peer gave the room up
    INVALID = "invalid"  # decode: the prefill refused the request itself (the client's 400)
    PATH_BROKEN = "KV path broken"  # decode: the prefill's KV path failed its probe


def abort_kind(message: str) -> FailureKind:
    """The kind of a room given up with ``message`` by someone else (the engine, or the peer's
    ``Abort``): only its text crosses that boundary (the side channel's ``Abort`` has no kind),
    and one that gave up because a timeout ran out says "timed out" in it."""
    return FailureKind.TIMED_OUT if "timed out" in message else FailureKind.ABORTED


@dataclass(frozen=True)
class TransferDone:
    """Prefill: the room's KV and first token are in decode memory; the source pages are free."""

    room: int


@dataclass(frozen=True)
class KVArrived:
    """Decode: the room's KV is in the destination pages; decode continues from ``first_token``."""

    room: int
    first_token: int
    logprob: FirstLogprob | None = None  # when the request asked for logprobs
    cached_tokens: int = 0  # prompt tokens the prefill served from its prefix cache
    choices: tuple[ChoiceFirst, ...] = ()  # n > 1: the further choices' first tokens


@dataclass(frozen=True)
class TransferFailed:
    """The room failed; ``message`` says why, ``kind`` what kind of failure it is.

    Prefill: no WRITE of the room is in flight, the source pages may be freed.
    Decode: end the request now, but keep the destination pages until ``RoomReleased``.
    """

    room: int
    message: str
    kind: FailureKind = FailureKind.ABORTED

    @property
    def invalid(self) -> bool:
        """Decode: the prefill refused the request itself (the client's 400)."""
        return self.kind is FailureKind.INVALID


@dataclass(frozen=True)
class RoomReleased:
    """Decode: no prefill can write into the room's destination pages any more; free them."""

    room: int


Event = TransferDone | KVArrived | TransferFailed | RoomReleased

# A WRITE that NIXL will not let go of keeps its pages held on both sides for at most this many
# transfer timeouts; past that the pages are freed with an ERROR (a leak is worse than the risk
# of a write NIXL has been cancelling for that long).
HOLD_BACKSTOP_FACTOR = 10

# A WRITE the prefill saw DONE (and said so with ``Written``) but whose NIXL notification never
# reached the decode within ``notif_grace``: the decode fails the room with a message starting
# with NOTIF_LOST, and the prefill, told so by that Abort, stops counting the WRITE as done.
NOTIF_LOST = "KV notification lost"
NOTIF_GRACE_S = 5.0  # after ``Written``; the notification is posted with the WRITE itself


def notif_grace(transfer_timeout: float) -> float:
    return min(NOTIF_GRACE_S, transfer_timeout)


def notif_lost_message(endpoint: tuple[str, int], agent: str | None, room: int,
                       ago: float) -> str:
    """The decode's reason (sent to the prefill in the Abort): the peer and the transport."""
    return (f"{NOTIF_LOST}: prefill {endpoint[0]}:{endpoint[1]} (NIXL agent {agent!r}) wrote "
            f"room {room}'s KV {ago:.1f} s ago, but its NIXL notification (a UCX active "
            "message) never arrived; UCX_PROTO_INFO=y shows the transport it took")
