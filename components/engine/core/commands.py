"""What other threads ask of the engine thread: the commands on its queue (``loop.py``).

Other threads never touch the scheduler; they put one of these on the queue, and the engine
thread applies it between two steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.engine.core.sequence import Sequence
from components.engine.kv.events import KvEventListener


@dataclass(frozen=True)
class AddRequest:
    """A new request (its other choices on ``seq.forks`` when n > 1)."""

    seq: Sequence


@dataclass(frozen=True)
class AbortRequest:
    rid: str
    abort_all: bool


@dataclass(frozen=True)
class SetListener:
    """Report cached blocks and load to ``listener`` from now on."""

    listener: KvEventListener


@dataclass(frozen=True)
class Stop:
    """End the loop; requests queued behind it still end like the rest (teardown)."""


Command = AddRequest | AbortRequest | SetListener | Stop
