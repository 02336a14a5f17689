"""Wire messages of the room watch: how a decode worker tells the prefill worker holding the
other half of a request that its half ended (docs/reference/room-watch.md).

One TCP connection per decode worker process and prefill worker; each frame is a 4-byte
big-endian length and a msgpack body (msgspec, never pickle). Decode -> prefill:

  ``Claim``    the decode half of ``room`` is live on this connection: the prefill keeps the
               room only while it is claimed (a dropped or silent connection ends every room
               it claimed);
  ``Release``  the decode half ended: ``done`` (nothing to do), ``cancelled`` (the client left),
               ``failed`` (the decode failed) or ``invalid`` (the decode refused the request as
               the client's error: the prefill ends its half with the same 400 and message);
  ``Ping``     the connection's owner is alive while it holds claims;
  ``ProbeKV``  run a one-token prefill into ``room`` now: the decode joins the room with a
               one-token request of its own, a real KV transfer through the engine's own path,
               before its requests use this prefill (``components/worker/rooms/kv_probe.py``).

Prefill -> decode, on the connection that claimed the room:

  ``PromptLogprobs``  the prompt logprobs of ``room`` the prefill's engine computed (the prompt's
               forward runs there only; the decode's stream carries them as an aggregated
               worker's does), or why there are none (``error``);
  ``LegEnded``  the prefill leg of ``room`` has sent its last item and its engine request is
               through (``n > 1``, frontend-orchestrated only): Dynamo 1.6.1's prefill router
               ends the whole response at the first finish chunk it gets before the prefill
               leg's stream ended, so the decode holds its first finish chunk until this comes
               (orchestration.md, "n > 1");
  ``KVProbed`` the prefill's half of the probe of ``room`` is through (``error`` empty) or why
               it failed.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, Union

import msgspec

from protocol.limits import (
    MAX_BOOTSTRAP_ROOM, MAX_TOKENS_LIMIT, MAX_TOP_LOGPROBS, MIN_BOOTSTRAP_ROOM,
)

Room = Annotated[int, msgspec.Meta(ge=MIN_BOOTSTRAP_ROOM, le=MAX_BOOTSTRAP_ROOM)]
Outcome = Literal["done", "cancelled", "failed", "invalid"]
# The ends a prefill must act on: every outcome but "done".
GONE = ("cancelled", "failed", "invalid")
MAX_FRAME_BYTES = 8192
# Prefill -> decode: a prompt's logprobs with 20 alternatives each take ~0.3 KB per prompt token.
MAX_LOGPROBS_FRAME_BYTES = 64 << 20
HEADER = struct.Struct(">I")


class Claim(msgspec.Struct, tag="claim", frozen=True, forbid_unknown_fields=True):
    room: Room


class Release(msgspec.Struct, tag="release", frozen=True, forbid_unknown_fields=True):
    room: Room
    outcome: Outcome
    message: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class Ping(msgspec.Struct, tag="ping", frozen=True, forbid_unknown_fields=True):
    pass


class ProbeKV(msgspec.Struct, tag="probe_kv", frozen=True, forbid_unknown_fields=True):
    room: Room


TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
Alternatives = Annotated[list[tuple[float, TokenId]], msgspec.Meta(max_length=MAX_TOP_LOGPROBS)]


class PromptLogprobs(msgspec.Struct, tag="prompt_logprobs", frozen=True,
                     forbid_unknown_fields=True):
    """SGLang's `input_token_logprobs` `(logprob | None, token id)` per prompt position and its
    `input_top_logprobs` (None where the engine has none: the first position)."""

    room: Room
    tokens: Annotated[list[tuple[float | None, TokenId]],
                      msgspec.Meta(max_length=MAX_TOKENS_LIMIT)] = []
    top: Annotated[list[Alternatives | None], msgspec.Meta(max_length=MAX_TOKENS_LIMIT)] = []
    error: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class LegEnded(msgspec.Struct, tag="leg_ended", frozen=True, forbid_unknown_fields=True):
    room: Room


class KVProbed(msgspec.Struct, tag="kv_probed", frozen=True, forbid_unknown_fields=True):
    room: Room
    error: Annotated[str, msgspec.Meta(max_length=4096)] = ""


ToPrefill = Union[Claim, Release, Ping, ProbeKV]
ToDecode = Union[PromptLogprobs, LegEnded, KVProbed]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(type=ToPrefill)
_to_decode = msgspec.msgpack.Decoder(type=ToDecode)


def frame(msg: ToPrefill | ToDecode) -> bytes:
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes, limit: int = MAX_FRAME_BYTES) -> int:
    """The body length a header announces; ValueError past `limit`."""
    (length,) = HEADER.unpack(header)
    if length > limit:
        raise ValueError(f"room-watch frame of {length} bytes (at most {limit})")
    return length


def decode(body: bytes) -> ToPrefill:
    """msgspec.DecodeError / ValidationError for anything but a well-formed message."""
    return _decoder.decode(body)


def decode_to_decode(body: bytes) -> ToDecode:
    """A prefill's frame, read by the decode (msgspec errors as `decode`)."""
    return _to_decode.decode(body)
