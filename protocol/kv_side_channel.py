"""Wire messages of the CPU engine's KV-transfer side channel (msgpack via msgspec, never pickle).

Decode -> prefill (ZMQ DEALER -> the prefill's bootstrap ROUTER):
  ``Hello``     once per connection: the decode agent's NIXL metadata, the base and size of its
                registered KV pool, its ``KVLayout``, its UCX error handling mode (which must
                equal the prefill's), and (with a shared secret) a nonce, a timestamp and an
                HMAC of the rest;
  ``Register``  once per room: where the room's KV goes (destination runs in decode memory);
  ``Abort``     decode gave the room up; prefill stops, drains any WRITE, then answers ``AbortAck``;
  ``Probe``     once per prefill, before any ``Register``: WRITE ``PROBE_BYTES`` of the known
                pattern into this slot of the decode's probe buffer (declared in the Hello),
                with a notification, so the decode knows the KV path works before using it.
Prefill -> decode (ROUTER -> DEALER):
  ``Welcome``   the Hello was accepted: the prefill's NIXL agent name (the only agent whose KV
                notifications decode accepts for rooms on this connection), HMAC'd with the
                Hello's nonce when a secret is set;
  ``Refused``   the Hello was refused (layout mismatch, name bound to another connection, bad
                secret, too many peers): every room on this connection fails with ``reason``;
  ``Holding``   a WRITE of the room may still land (NIXL has not let go of it): keep the pages
                until ``Abort``/``AbortAck``, however long (up to the holding backstop);
  ``Abort``     prefill failed or gave the room up; no WRITE of the room is in flight any more;
  ``AbortAck``  answer to a decode ``Abort``: no WRITE of the room is in flight any more;
  ``Written``   the room's WRITE is DONE: a wake-up only, so decode reads the NIXL notification
                now rather than at the end of its poll slice (the notification stays the signal);
  ``Probed``    the probe's WRITE is DONE (a wake-up, as ``Written``) or failed (``reason``).
Prefill -> decode (NIXL notification attached to the WRITE, delivered after the data):
  ``KVNotif``   ``{room, first_token, logprob?, cached_tokens?, choices?}`` (a probe's: ``room``
                is the probe's nonce, ``first_token`` 0): ``logprob`` only when the
                request asked for logprobs (the first token's, and its top alternatives, as
                ``FirstLogprob``); ``cached_tokens`` only when the prefill's cache served some
                of the prompt; ``choices`` only with ``n > 1``: choices 1 .. n-1's first tokens
                (``ChoiceFirst``), which the decode forks the room's one prompt KV into.

Every decode uses ``msgspec.msgpack.Decoder(type=...)`` after a size check: a message too big or
of the wrong shape is dropped by the receiver. The bounds below are what a hostile peer can make
a receiver hold, not what a real model needs.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec

from protocol.limits import MAX_BOOTSTRAP_ROOM, MAX_CHOICES, MAX_TOP_LOGPROBS, MIN_BOOTSTRAP_ROOM

# Rooms are picked in [1, 2^63); 0 is SGLang's "not written" marker, so it is refused.
Room = Annotated[int, msgspec.Meta(ge=MIN_BOOTSTRAP_ROOM, le=MAX_BOOTSTRAP_ROOM)]
Address = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Length = Annotated[int, msgspec.Meta(gt=0, le=2**63 - 1)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]
AgentName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Message = Annotated[str, msgspec.Meta(max_length=4096)]
# A room's runs: layers * 2 * kv_heads per contiguous page run (a 128-layer, 64-head model has
# 16K); the cap keeps one Register under MAX_MESSAGE_BYTES.
Runs = Annotated[list[tuple[Address, Length]], msgspec.Meta(min_length=1, max_length=1 << 16)]
# NIXL agent metadata is ~0.5 KiB with UCX; the cap only stops a hostile peer.
Metadata = Annotated[bytes, msgspec.Meta(min_length=1, max_length=1 << 20)]
Token = Annotated[bytes, msgspec.Meta(max_length=64)]
# UCX endpoint error handling (NIXL's ``ucx_error_handling_mode``): UCX refuses to connect
# endpoints whose modes differ, so the prefill checks the decode's in its Hello.
UcxErrorHandling = Literal["none", "peer"]

# The KV path probe: each probe WRITEs PROBE_BYTES into one of PROBE_SLOTS slots of the decode's
# probe buffer (one slot per prefill being probed at once).
PROBE_BYTES = 256
PROBE_SLOTS = 16

# Enforced by ZMQ (MAXMSGSIZE drops the connection) and again before any decode.
MAX_MESSAGE_BYTES = 2 << 20
# A notification with 20 top logprobs is ~330 bytes, and each further choice's first token
# (n > 1) adds as much again.
MAX_NOTIF_BYTES = 512 * MAX_CHOICES


class KVLayout(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the bytes of a page mean: two engines move KV only if theirs are equal."""

    dtype: Annotated[str, msgspec.Meta(max_length=32)]
    num_layers: Count
    num_kv_heads: Count
    head_dim: Count
    page_size: Count
    model_id: Annotated[str, msgspec.Meta(max_length=512)]
    # The pool's storage order (KVPool's ``layout``): the runs of a room are listed in it.
    order: Annotated[str, msgspec.Meta(max_length=16)] = "head"

    def describe(self) -> str:
        return (f"{self.model_id} {self.dtype} layers={self.num_layers} "
                f"kv_heads={self.num_kv_heads} head_dim={self.head_dim} page={self.page_size} "
                f"{self.order}-major")


class Hello(msgspec.Struct, tag="hello", frozen=True, forbid_unknown_fields=True,
            omit_defaults=True):
    # omit_defaults: a Hello without pool, layout or secret reads the same as before they existed
    agent_name: AgentName
    agent_metadata: Metadata
    pool_base: Address = 0  # the decode's registered KV pool: Register runs must lie inside
    pool_bytes: Address = 0
    layout: KVLayout | None = None
    nonce: Token = b""  # with a shared secret: fresh per connection
    sent_at: float = 0.0  # with a shared secret: Unix time, bounds how long a replay is checked
    mac: Token = b""  # with a shared secret: HMAC-SHA256 of this Hello with mac=b""
    ucx_error_handling: UcxErrorHandling = "peer"  # absent: NIXL's default
    probe_base: Address = 0  # the decode's probe buffer (PROBE_SLOTS * PROBE_BYTES): 0, none


class Register(msgspec.Struct, tag="register", frozen=True, forbid_unknown_fields=True,
               omit_defaults=True):
    # omit_defaults: a Register without skip_tokens reads the same as before it existed
    room: Room
    agent_name: AgentName
    runs: Runs
    # The prompt's first tokens the decode already holds (its prefix cache): ``runs`` cover the
    # rest, and the prefill WRITEs only that.
    skip_tokens: Count = 0


class Abort(msgspec.Struct, tag="abort", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName
    message: Message = "Aborted"
    # From a prefill: it refused the request itself (the client's error, a 400), so the decode
    # ends its half with the same 400 rather than a transfer failure (500). With the frontend
    # orchestrating, both halves answer the client, and the first answer wins.
    invalid: bool = False


class AbortAck(msgspec.Struct, tag="abort_ack", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName


class Welcome(msgspec.Struct, tag="welcome", frozen=True, forbid_unknown_fields=True):
    agent_name: AgentName
    mac: Token = b""


class Refused(msgspec.Struct, tag="refused", frozen=True, forbid_unknown_fields=True):
    agent_name: AgentName
    reason: Message


class Holding(msgspec.Struct, tag="holding", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName


class Written(msgspec.Struct, tag="written", frozen=True, forbid_unknown_fields=True):
    room: Room
    agent_name: AgentName


class Probe(msgspec.Struct, tag="probe", frozen=True, forbid_unknown_fields=True):
    nonce: Room  # also the probe notification's ``room``: picked unlike any live room
    agent_name: AgentName
    slot: Annotated[int, msgspec.Meta(ge=0, lt=PROBE_SLOTS)]


class Probed(msgspec.Struct, tag="probed", frozen=True, forbid_unknown_fields=True):
    nonce: Room
    agent_name: AgentName
    reason: Message = ""  # empty: the WRITE is DONE; else why it failed


TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]


class FirstLogprob(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """The first token's logprob and its best alternatives ``(logprob, token_id)``, best first."""

    logprob: float
    top: Annotated[list[tuple[float, TokenId]], msgspec.Meta(max_length=MAX_TOP_LOGPROBS)] = []


class ChoiceFirst(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One further choice's first token (n > 1), and its logprobs when the request asked."""

    token: TokenId
    logprob: FirstLogprob | None = None


class KVNotif(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    # omit_defaults: without logprobs or a cache hit the notification is the same bytes as
    # before they existed
    room: Room
    first_token: TokenId
    logprob: FirstLogprob | None = None
    # Prompt tokens the prefill served from its prefix cache: the decode reports them in its
    # usage, as SGLang's decode reports its prefill's (the decode clamps it to the prompt).
    cached_tokens: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] = 0
    # n > 1: choices 1 .. n-1's first tokens, sampled from the same prompt forward.
    choices: Annotated[list[ChoiceFirst], msgspec.Meta(max_length=MAX_CHOICES - 1)] = []


ToPrefill = Union[Hello, Register, Abort, Probe]
ToDecode = Union[Abort, AbortAck, Welcome, Refused, Holding, Written, Probed]

_encoder = msgspec.msgpack.Encoder()
to_prefill_decoder = msgspec.msgpack.Decoder(type=ToPrefill)
to_decode_decoder = msgspec.msgpack.Decoder(type=ToDecode)
notif_decoder = msgspec.msgpack.Decoder(type=KVNotif)


def encode(msg: Hello | Register | Abort | AbortAck | Welcome | Refused | Holding | Written
           | Probe | Probed | KVNotif) -> bytes:
    return _encoder.encode(msg)
