"""How a request ended: one vocabulary for the worker's `requests` metric, its logs and the room
watch, decided in one place from what ended the handler's stream.

The metric's labels are the Outcome values (docs/reference/metrics.md); the room watch's
`Release` carries the coarser wire value of `released_as` (protocol/room_watch.py): the
prefill stopping its half needs to know whether the client's request was wrong ("invalid",
the same 400 from both halves), the client left ("cancelled"), or the half failed.
"""

import asyncio
from enum import Enum

from handlers.core.errors import EngineUnavailable, PrefillUnavailable, RequestError
from handlers.core.guard import Stopped


class Outcome(str, Enum):
    SUCCESS = "success"
    CANCELLED = "cancelled"  # the client left or stopped the request
    INVALID = "invalid"  # the client's error: a 400 naming it
    UNAVAILABLE = "unavailable"  # turned away for now: a 503 a client may retry
    ERROR = "error"  # anything else: a 500

    @property
    def released_as(self) -> str:
        """The room watch's word for it (`protocol.room_watch.Outcome`)."""
        return _RELEASED_AS[self]


_RELEASED_AS = {Outcome.SUCCESS: "done", Outcome.CANCELLED: "cancelled",
                Outcome.INVALID: "invalid", Outcome.UNAVAILABLE: "failed",
                Outcome.ERROR: "failed"}


def outcome_of(exc: BaseException) -> Outcome:
    """The outcome of a stream that `exc` ended."""
    if isinstance(exc, RequestError):
        return Outcome.INVALID
    if isinstance(exc, (PrefillUnavailable, EngineUnavailable)):
        return Outcome.UNAVAILABLE
    # Stopped: the client stopped it; GeneratorExit / CancelledError: the runtime closed the
    # stream or cancelled its task because the client went away
    if isinstance(exc, (Stopped, GeneratorExit, asyncio.CancelledError)):
        return Outcome.CANCELLED
    return Outcome.ERROR


def outcome_of_stream(finish: "str | None", stopped: bool) -> Outcome:
    """The outcome of a stream that ended normally, its last finish reason `finish`: a stop
    that comes after the last item went out (a decode closing a prefill's stream as soon as it
    has read the prefill's done item) cancelled nothing."""
    if finish == "cancelled" or (stopped and finish is None):
        return Outcome.CANCELLED
    return Outcome.SUCCESS
