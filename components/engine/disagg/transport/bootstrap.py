"""The KV-transfer side channel: ZMQ ROUTER on prefill (the bootstrap server), DEALERs on decode
(``bootstrap_client.py``).

Frames are msgpack (msgspec Structs of ``protocol.kv_side_channel``), never pickle. A frame over
``MAX_MESSAGE_BYTES`` is refused by ZMQ (MAXMSGSIZE) and checked again before any decode;
malformed or unknown messages are logged (throttled) and dropped. All sends are non-blocking;
every socket has linger 0, so closing never waits for a dead peer. Engine thread only.

The server also reports which connections dropped, so the prefill can unbind the agent names
they introduced: ROUTER identities are per connection, and each message carries the file
descriptor of its connection (``zmq.SRCFD``), which the socket monitor names when it closes.
"""

from __future__ import annotations

import logging

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from components.engine.disagg.transport.peers import Throttle
from protocol.kv_side_channel import MAX_MESSAGE_BYTES, ToPrefill, encode, to_prefill_decoder

logger = logging.getLogger(__name__)

Endpoint = tuple[str, int]
# Drains are bounded so one flood of messages cannot starve the engine loop.
MAX_DRAIN = 1024
_UNKNOWN = b""  # a connection accepted whose identity is not known yet


def tcp_address(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def new_socket(ctx: zmq.Context, kind: int, host: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class BootstrapServer:
    """Prefill side: one ROUTER bound to ``host:port`` (port None/0 picks a free port)."""

    def __init__(self, ctx: zmq.Context, host: str, port: int | None, throttle: Throttle) -> None:
        self.socket = new_socket(ctx, zmq.ROUTER, host)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        try:
            # Port None/0: the OS picks a free one ("*"), read back from the bound endpoint.
            self.socket.bind(tcp_address(host, port or "*"))
            self.port = int(self.socket.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        except zmq.ZMQError as exc:
            self.close()
            raise RuntimeError(
                f"cannot bind the KV bootstrap server to {host}:{port}: {exc}") from exc
        self.host = host
        self._throttle = throttle
        self._fd_of: dict[bytes, int] = {}  # identity -> its connection's fd
        self._at_fd: dict[int, bytes] = {}  # open connection's fd -> identity (or _UNKNOWN)
        self._dropped: list[bytes] = []
        self._gone: dict[bytes, None] = {}  # identities of closed connections (recent ones)
        logger.info("KV bootstrap server listening on %s", tcp_address(host, self.port))

    @property
    def connections(self) -> int:
        return len(self._at_fd)

    def recv_all(self) -> tuple[list[tuple[bytes, ToPrefill]], list[bytes]]:
        """(messages, identities whose connection dropped since the last call)."""
        self._drain_monitor()
        out: list[tuple[bytes, ToPrefill]] = []
        for _ in range(MAX_DRAIN):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(frames) != 2 or len(frames[1]) > MAX_MESSAGE_BYTES:
                self._throttle.warn("frame", "bootstrap server: dropped a message of %d frames",
                                    len(frames))
                continue
            identity = frames[0].bytes
            if identity not in self._fd_of and not self._track(identity, frames[1].get(zmq.SRCFD)):
                continue
            try:
                out.append((identity, to_prefill_decoder.decode(frames[1].buffer)))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self._throttle.warn("malformed", "bootstrap server: dropped a malformed "
                                    "message: %s", exc)
        self._drain_monitor()
        dropped, self._dropped = self._dropped, []
        return out, dropped

    def _track(self, identity: bytes, fd: int) -> bool:
        """First message of a connection: remember its fd. The monitor announced the accept
        before any message of it could arrive, so draining it first makes the fd's entry this
        connection's (any earlier connection on the same fd is closed and reported by now)."""
        self._drain_monitor()
        if identity in self._gone:
            return False  # still queued from a connection the monitor reported closed
        previous = self._at_fd.get(fd, _UNKNOWN)
        if previous != _UNKNOWN:
            # fds are unique among open connections: the previous one closed unreported.
            self._lost(fd)
        self._at_fd[fd] = identity
        self._fd_of[identity] = fd
        return True

    def _lost(self, fd: int) -> None:
        identity = self._at_fd.pop(fd, _UNKNOWN)
        if identity != _UNKNOWN:
            del self._fd_of[identity]
            self._dropped.append(identity)
            self._gone[identity] = None
            if len(self._gone) > MAX_DRAIN:
                del self._gone[next(iter(self._gone))]

    def _drain_monitor(self) -> None:
        for _ in range(MAX_DRAIN):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._at_fd[fd] = _UNKNOWN
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._lost(fd)

    def send(self, identity: bytes, msg) -> bool:
        try:
            self.socket.send_multipart([identity, encode(msg)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            self._throttle.warn("send", "bootstrap server: send to a decode peer failed: %s", exc)
            return False

    def close(self) -> None:
        close_monitored(self.socket, self.monitor)


def close_monitored(socket: zmq.Socket, monitor: zmq.Socket) -> None:
    """Close a socket and the monitor socket watching it (the monitor first, as ZMQ wants)."""
    try:
        socket.disable_monitor()
    except zmq.ZMQError:
        pass  # already closed, or the context is terminating
    monitor.close()
    socket.close()
