"""``Outbox``: everything the engine service sends, one ZMQ message per peer per loop turn.

An engine step wakes every running request's relay in the same turn of the service's loop; each
relay posts its chunk here, and one flush in the next turn sends a peer all its messages as one
``wire.Batch`` (a single message goes as itself: the one-shot query sockets of attached workers
expect their reply bare). Per step that is one send, one receive, one decode on each side instead
of one per request: the worker's event loop pays per message, not per chunk. Order is kept: every
message to a peer goes through here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from components.engine.process import wire


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: Any) -> None:
        self._loop = loop
        self._sock = sock  # a zmq.asyncio ROUTER: its sends queue in order behind earlier ones
        self._pending: dict[bytes, list[Any]] = {}

    def post(self, peer: bytes, msg: Any) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.setdefault(peer, []).append(msg)

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if self._sock.closed:  # the service stopped: its peers get nothing more
            return
        for peer, msgs in pending.items():
            msg = msgs[0] if len(msgs) == 1 else wire.Batch(items=msgs)
            self._sock.send_multipart([peer, wire.encode(msg)])
