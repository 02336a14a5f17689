"""Events ``KVTransport.poll()`` returns (transport.py says when the engine frees pages)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.kv_side_channel import FirstLogprob


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


@dataclass(frozen=True)
class TransferFailed:
    """The room failed (timeout, peer abort, NIXL error, layout mismatch); ``message`` says why.

    Prefill: no WRITE of the room is in flight, the source pages may be freed.
    Decode: end the request now, but keep the destination pages until ``RoomReleased``.
    """

    room: int
    message: str
    invalid: bool = False  # decode: the prefill refused the request itself (the client's 400)


@dataclass(frozen=True)
class RoomReleased:
    """Decode: no prefill can write into the room's destination pages any more; free them."""

    room: int


Event = TransferDone | KVArrived | TransferFailed | RoomReleased

# A WRITE that NIXL will not let go of keeps its pages held on both sides for at most this many
# transfer timeouts; past that the pages are freed with an ERROR (a leak is worse than the risk
# of a write NIXL has been cancelling for that long).
HOLD_BACKSTOP_FACTOR = 10
