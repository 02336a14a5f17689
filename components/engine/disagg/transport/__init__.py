"""The CPU engine's KV transport: prefill -> decode KV pages over NIXL, rooms met through the
prefill's bootstrap server. The engine uses only what this module exports; ``transport.py``
documents the protocol and when the engine may free pages."""

from components.engine.disagg.transport.events import (
    Event,
    FailureKind,
    KVArrived,
    RoomReleased,
    TransferDone,
    TransferFailed,
)
from components.engine.disagg.transport.decode_transport import DecodeTransport
from components.engine.disagg.transport.factory import KVTransport
from components.engine.disagg.transport.peering import Peering, engine_peering
from components.engine.disagg.transport.prefill_transport import PrefillTransport
from components.engine.disagg.transport.runs import Run

__all__ = ["KVTransport", "PrefillTransport", "DecodeTransport", "Run", "Event", "FailureKind",
           "KVArrived", "RoomReleased", "TransferDone", "TransferFailed", "Peering",
           "engine_peering"]
