"""Decode side of the side channel: one DEALER per prefill bootstrap endpoint (``bootstrap.py``
has the server and the framing rules)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from components.engine.disagg.transport.bootstrap import (
    MAX_DRAIN,
    Endpoint,
    close_monitored,
    new_socket,
    tcp_address,
)
from components.engine.disagg.transport.peers import Throttle
from protocol.kv_side_channel import MAX_MESSAGE_BYTES, Hello, ToDecode, encode, to_decode_decoder

logger = logging.getLogger(__name__)


class _Peer:
    def __init__(self, ctx: zmq.Context, endpoint: Endpoint, hello: Hello) -> None:
        host, port = endpoint
        self.socket = new_socket(ctx, zmq.DEALER, host)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        try:
            self.socket.connect(tcp_address(host, port))
        except zmq.ZMQError:
            self.close()
            raise
        self.hello = hello  # this connection's Hello (its nonce authenticates the Welcome)
        self.connected = False  # a TCP connection was established at least once
        self.lost = False  # ... and then dropped

    def drain_monitor(self) -> None:
        for _ in range(MAX_DRAIN):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.lost = True

    def close(self) -> None:
        close_monitored(self.socket, self.monitor)


class BootstrapClient:
    """Decode side: one DEALER per prefill bootstrap endpoint, created on first use.

    The first message to a peer is a fresh ``hello()`` (this agent's NIXL metadata, signed when
    a secret is set). A monitor reports when the TCP connection drops: the peer is forgotten (a
    later room reconnects and says hello again) and the owner fails its rooms, since a process
    whose socket closed is no longer writing.
    """

    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, hello: Callable[[], Hello],
                 throttle: Throttle) -> None:
        self._ctx = ctx
        self._poller = poller
        self._hello = hello
        self._throttle = throttle
        self._peers: dict[Endpoint, _Peer] = {}

    def send(self, endpoint: Endpoint, msg) -> bool:
        """Queue ``msg`` to ``endpoint`` (connects and says hello first if needed)."""
        peer = self._peers.get(endpoint)
        if peer is None:
            try:
                peer = _Peer(self._ctx, endpoint, self._hello())
            except zmq.ZMQError as exc:  # an address ZMQ cannot dial: this room fails alone
                logger.warning("KV side channel: cannot connect to %s:%s: %s", *endpoint, exc)
                return False
            self._peers[endpoint] = peer
            self._poller.register(peer.socket, zmq.POLLIN)
            self._poller.register(peer.monitor, zmq.POLLIN)
            if not self._send(endpoint, peer, peer.hello):
                return False
        return self._send(endpoint, peer, msg)

    def hello_nonce(self, endpoint: Endpoint) -> bytes | None:
        peer = self._peers.get(endpoint)
        return peer.hello.nonce if peer is not None else None

    def was_connected(self, endpoint: Endpoint) -> bool:
        """Whether ``endpoint`` may have received anything (a TCP connection came up)."""
        peer = self._peers.get(endpoint)
        if peer is None:
            return False
        # ZMQ queues the CONNECTED event before any byte can flow, so draining it here is exact.
        peer.drain_monitor()
        return peer.connected

    def _send(self, endpoint: Endpoint, peer: _Peer, msg) -> bool:
        try:
            peer.socket.send(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            logger.warning("KV side channel: send to %s:%s failed: %s", *endpoint, exc)
            return False

    def recv_all(self) -> tuple[list[tuple[Endpoint, ToDecode]], list[Endpoint]]:
        """(messages, endpoints whose connection dropped since the last call)."""
        messages: list[tuple[Endpoint, ToDecode]] = []
        dropped: list[Endpoint] = []
        for endpoint, peer in list(self._peers.items()):
            for _ in range(MAX_DRAIN):
                try:
                    data = peer.socket.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    if len(data) > MAX_MESSAGE_BYTES:
                        raise msgspec.DecodeError(f"{len(data)} bytes is over the limit")
                    messages.append((endpoint, to_decode_decoder.decode(data.buffer)))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    self._throttle.warn("malformed", "KV side channel: dropped a malformed "
                                        "message from %s:%s: %s", *endpoint, exc)
            peer.drain_monitor()
            if peer.lost:
                logger.warning("KV side channel: lost the connection to prefill %s:%s", *endpoint)
                dropped.append(endpoint)
                self.forget(endpoint)
        return messages, dropped

    def forget(self, endpoint: Endpoint) -> None:
        peer = self._peers.pop(endpoint, None)
        if peer is not None:
            self._poller.unregister(peer.socket)
            self._poller.unregister(peer.monitor)
            peer.close()

    def close(self) -> None:
        for endpoint in list(self._peers):
            self.forget(endpoint)
