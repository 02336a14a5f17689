"""The one table of what a client sees when a room's KV transfer fails, by the failure's kind
(``transport/events.py``); the coordinator ends the room's request with it."""

from __future__ import annotations

from components.engine.disagg.transport.events import FailureKind

TIMEOUT_STATUS = 504
FAILURE_STATUS = 500
INVALID_STATUS = 400  # the request itself was refused (the engine's 400s)
UNAVAILABLE_STATUS = 503  # this pairing cannot serve now; another prefill (or later) can
# What the client sees when a room's transfer fails, by the failure's kind.
FAILURE_STATUS_BY_KIND = {
    FailureKind.TIMED_OUT: TIMEOUT_STATUS,
    FailureKind.PEER_LOST: FAILURE_STATUS,
    FailureKind.REFUSED: FAILURE_STATUS,
    FailureKind.NIXL_ERROR: FAILURE_STATUS,
    FailureKind.ABORTED: FAILURE_STATUS,
    FailureKind.INVALID: INVALID_STATUS,  # the prefill refused the request: the client's error
    FailureKind.PATH_BROKEN: UNAVAILABLE_STATUS,  # the KV path failed its probe (path_probe.py)
}
