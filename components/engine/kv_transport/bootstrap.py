"""The KV-transfer side channel: ZMQ ROUTER on prefill (the bootstrap server), DEALERs on decode.

Frames are msgpack (msgspec Structs of ``protocol.kv_side_channel``), never pickle. Malformed or
unknown messages are logged and dropped. All sends are non-blocking; every socket has linger 0,
so closing never waits for a dead peer. Used on the engine thread only.
"""

from __future__ import annotations

import logging

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol.kv_side_channel import (
    MAX_MESSAGE_BYTES,
    Hello,
    ToDecode,
    ToPrefill,
    encode,
    to_decode_decoder,
    to_prefill_decoder,
)

logger = logging.getLogger(__name__)

Endpoint = tuple[str, int]
# Drains are bounded so one flood of messages cannot starve the engine loop.
_MAX_DRAIN = 1024


def tcp_address(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _new_socket(ctx: zmq.Context, kind: int, host: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class BootstrapServer:
    """Prefill side: one ROUTER bound to ``host:port`` (port None/0 picks a free port)."""

    def __init__(self, ctx: zmq.Context, host: str, port: int | None) -> None:
        self.socket = _new_socket(ctx, zmq.ROUTER, host)
        try:
            # Port None/0: the OS picks a free one ("*"), read back from the bound endpoint.
            self.socket.bind(tcp_address(host, port or "*"))
            self.port = int(self.socket.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        except zmq.ZMQError as exc:
            self.socket.close()
            raise RuntimeError(
                f"cannot bind the KV bootstrap server to {host}:{port}: {exc}") from exc
        self.host = host
        logger.info("KV bootstrap server listening on %s", tcp_address(host, self.port))

    def recv_all(self) -> list[tuple[bytes, ToPrefill]]:
        out: list[tuple[bytes, ToPrefill]] = []
        for _ in range(_MAX_DRAIN):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                logger.warning("bootstrap server: dropped a message of %d frames", len(frames))
                continue
            try:
                out.append((frames[0], to_prefill_decoder.decode(frames[1])))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                logger.warning("bootstrap server: dropped a malformed message: %s", exc)
        return out

    def send(self, identity: bytes, msg) -> bool:
        try:
            self.socket.send_multipart([identity, encode(msg)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            logger.warning("bootstrap server: send to a decode peer failed: %s", exc)
            return False

    def close(self) -> None:
        self.socket.close()


class _Peer:
    def __init__(self, ctx: zmq.Context, endpoint: Endpoint) -> None:
        host, port = endpoint
        self.socket = _new_socket(ctx, zmq.DEALER, host)
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.socket.connect(tcp_address(host, port))
        self.connected = False  # a TCP connection was established at least once
        self.lost = False  # ... and then dropped

    def drain_monitor(self) -> None:
        for _ in range(_MAX_DRAIN):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.lost = True

    def close(self) -> None:
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close()
        self.socket.close()


class BootstrapClient:
    """Decode side: one DEALER per prefill bootstrap endpoint, created on first use.

    The first message to a peer is ``hello`` (this agent's NIXL metadata). A monitor reports when
    the TCP connection drops: the peer is forgotten (a later room reconnects and says hello again)
    and the owner fails its rooms, since a process whose socket closed is no longer writing.
    """

    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, hello: Hello) -> None:
        self._ctx = ctx
        self._poller = poller
        self._hello = hello
        self._peers: dict[Endpoint, _Peer] = {}

    def send(self, endpoint: Endpoint, msg) -> bool:
        """Queue ``msg`` to ``endpoint`` (connects and says hello first if needed)."""
        peer = self._peers.get(endpoint)
        if peer is None:
            try:
                peer = _Peer(self._ctx, endpoint)
            except zmq.ZMQError as exc:  # an address ZMQ cannot dial: this room fails alone
                logger.warning("KV side channel: cannot connect to %s:%s: %s", *endpoint, exc)
                return False
            self._peers[endpoint] = peer
            self._poller.register(peer.socket, zmq.POLLIN)
            self._poller.register(peer.monitor, zmq.POLLIN)
            if not self._send(endpoint, peer, self._hello):
                return False
        return self._send(endpoint, peer, msg)

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
            for _ in range(_MAX_DRAIN):
                try:
                    data = peer.socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    messages.append((endpoint, to_decode_decoder.decode(data)))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    logger.warning("KV side channel: dropped a malformed message from %s:%s: %s",
                                   *endpoint, exc)
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
