"""The CPU engine's KV transport: prefill -> decode KV pages over NIXL, rooms met through the
prefill's bootstrap server. The engine uses only what this module exports; ``transport.py``
documents the protocol and when the engine may free pages."""

from components.engine.kv_transport.events import (
    Event,
    KVArrived,
    RoomReleased,
    TransferDone,
    TransferFailed,
)
from components.engine.kv_transport.peering import Peering, engine_peering
from components.engine.kv_transport.runs import Run
from components.engine.kv_transport.transport import KVTransport

__all__ = ["KVTransport", "Run", "Event", "KVArrived", "RoomReleased", "TransferDone",
           "TransferFailed", "Peering", "engine_peering"]
