"""One room on the decode side of the KV transport (decode_side.py): where its KV comes from,
its deadline and state (WAITING until the KV arrives; RELEASING until no prefill can write into
its pages), and the notifications that came before its prefill's Welcome."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.engine.disagg.transport.bootstrap import Endpoint
from components.engine.disagg.transport.runs import Run
from protocol.kv_side_channel import KVNotif

MAX_EARLY = 4  # notifications kept per room before its prefill's Welcome


@dataclass
class DecodeRoom:
    room: int
    rid: str
    endpoint: Endpoint
    deadline: float  # WAITING: KV deadline; RELEASING: grace deadline
    since: float  # when the current state began
    releasing: bool = False
    held: bool = False  # the prefill said a WRITE of it may still land
    written: float | None = None  # when the prefill said its WRITE was DONE (``Written``)
    queued: bool = False  # its Register is not sent: the KV path probe is under way or failed
    # Notifications that came before the Welcome (a few: a stranger's must not hide the real one)
    early: list[tuple[str, KVNotif]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    skip: int = 0  # the prompt's first tokens this engine already holds: ``runs`` are the rest
