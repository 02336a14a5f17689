"""The engine requests a handler has in flight, so a worker that stops can end them.

A stopping worker first lets its requests finish (Dynamo's drain); once its drain time has
run out it ends every live request and any that starts later, with the same error. Rids carry
this process's id as a prefix: an engine serving several processes (`--tokenizer-worker-num`)
can then abort everything one dead process asked for with one abort (SGLang's aborts match rid
prefixes)."""

from __future__ import annotations

import os
import time
from typing import Optional, Protocol


class Endable(Protocol):
    def end(self, error: Exception) -> None: ...


def rid_prefix(pid: int) -> str:
    """The prefix of every rid process `pid` gives its engine requests."""
    return f"{pid:x}-"


def new_rid() -> str:
    return rid_prefix(os.getpid()) + os.urandom(16).hex()  # uuid4's 32 hex digits, faster


class LiveRequests:
    def __init__(self) -> None:
        self._live: set[Endable] = set()
        self._closed: Optional[Exception] = None
        self.last_end: Optional[float] = None  # time.monotonic() when a request last ended

    def __len__(self) -> int:
        return len(self._live)

    def add(self, request: Endable) -> None:
        self._live.add(request)
        if self._closed is not None:  # started after the worker gave up draining
            request.end(self._closed)

    def discard(self, request: Endable) -> None:
        if request in self._live:
            self._live.discard(request)
            self.last_end = time.monotonic()

    def end_all(self, error: Exception) -> int:
        """End every live request and every one that starts from now on; how many were live."""
        self._closed = error
        live = list(self._live)
        for request in live:
            request.end(error)
        return len(live)
