"""Wire messages of the CPU engine's KV-transfer side channel (msgpack via msgspec, never pickle).

Decode -> prefill (ZMQ DEALER -> the prefill's bootstrap ROUTER):
  ``Hello``     once per peer connection: the decode agent's NIXL metadata;
  ``Register``  once per room: where the room's KV goes (destination runs in decode memory);
  ``Abort``     decode gave the room up; prefill stops, drains any WRITE, then answers ``AbortAck``.
Prefill -> decode (ROUTER -> DEALER):
  ``Abort``     prefill failed or gave the room up; no WRITE of the room is in flight any more;
  ``AbortAck``  answer to a decode ``Abort``: no WRITE of the room is in flight any more.
Prefill -> decode (NIXL notification attached to the WRITE, delivered after the data):
  ``KVNotif``   ``{room, first_token}``.

Every decode uses ``msgspec.msgpack.Decoder(type=...)``: a message of the wrong shape raises
``msgspec.DecodeError`` / ``ValidationError`` and is dropped by the receiver.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

# Rooms are picked in [1, 2^63); 0 is SGLang's "not written" marker, so it is refused.
Room = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
Address = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Length = Annotated[int, msgspec.Meta(gt=0, le=2**63 - 1)]
AgentName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Message = Annotated[str, msgspec.Meta(max_length=4096)]
# A room's runs: layers * 2 * kv_heads per contiguous page run; 1M is far above any real model.
Runs = Annotated[list[tuple[Address, Length]], msgspec.Meta(min_length=1, max_length=1 << 20)]
# NIXL agent metadata is ~0.5 KiB with UCX; the cap only stops a hostile peer.
Metadata = Annotated[bytes, msgspec.Meta(min_length=1, max_length=1 << 20)]

MAX_MESSAGE_BYTES = 32 << 20


class Hello(msgspec.Struct, tag="hello", frozen=True, forbid_unknown_fields=True):
    agent_name: AgentName
    agent_metadata: Metadata


class Register(msgspec.Struct, tag="register", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName
    runs: Runs


class Abort(msgspec.Struct, tag="abort", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName
    message: Message = "Aborted"


class AbortAck(msgspec.Struct, tag="abort_ack", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName


class KVNotif(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    room: Room
    first_token: Annotated[int, msgspec.Meta(ge=0, lt=2**31)]


ToPrefill = Union[Hello, Register, Abort]
ToDecode = Union[Abort, AbortAck]

_encoder = msgspec.msgpack.Encoder()
to_prefill_decoder = msgspec.msgpack.Decoder(type=ToPrefill)
to_decode_decoder = msgspec.msgpack.Decoder(type=ToDecode)
notif_decoder = msgspec.msgpack.Decoder(type=KVNotif)


def encode(msg: Hello | Register | Abort | AbortAck | KVNotif) -> bytes:
    return _encoder.encode(msg)
