"""Wire messages of the room watch: how a decode worker tells the prefill worker holding the
other half of a request that its half ended (docs/reference/room-watch.md).

One TCP connection per decode worker process and prefill worker; each frame is a 4-byte
big-endian length and a msgpack body (msgspec, never pickle). Decode -> prefill only:

  ``Claim``    the decode half of ``room`` is live on this connection: the prefill keeps the
               room only while it is claimed (a dropped or silent connection ends every room
               it claimed);
  ``Release``  the decode half ended: ``done`` (nothing to do), ``cancelled`` (the client left),
               ``failed`` (the decode failed) or ``invalid`` (the decode refused the request as
               the client's error: the prefill ends its half with the same 400 and message);
  ``Ping``     the connection's owner is alive while it holds claims.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, Union

import msgspec

from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM

Room = Annotated[int, msgspec.Meta(ge=MIN_BOOTSTRAP_ROOM, le=MAX_BOOTSTRAP_ROOM)]
Outcome = Literal["done", "cancelled", "failed", "invalid"]
# The ends a prefill must act on: every outcome but "done".
GONE = ("cancelled", "failed", "invalid")
MAX_FRAME_BYTES = 8192
HEADER = struct.Struct(">I")


class Claim(msgspec.Struct, tag="claim", frozen=True, forbid_unknown_fields=True):
    room: Room


class Release(msgspec.Struct, tag="release", frozen=True, forbid_unknown_fields=True):
    room: Room
    outcome: Outcome
    message: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class Ping(msgspec.Struct, tag="ping", frozen=True, forbid_unknown_fields=True):
    pass


ToPrefill = Union[Claim, Release, Ping]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(type=ToPrefill)


def frame(msg: Claim | Release | Ping) -> bytes:
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a header announces; ValueError past MAX_FRAME_BYTES."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"room-watch frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    return length


def decode(body: bytes) -> Claim | Release | Ping:
    """msgspec.DecodeError / ValidationError for anything but a well-formed message."""
    return _decoder.decode(body)
