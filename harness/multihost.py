"""The disaggregated topology split over two hosts (``harness/netns.py``), as a two-node
deployment runs it: etcd, NATS, the frontend and the decode worker on host A, the prefill
worker on host B; every process reaches the others only through the hosts' addresses.

The test process stays in the machine's own namespace; ``entered(host)`` moves the calling
thread into a host's network namespace (``setns``; network namespaces are per thread) for the
HTTP calls to the frontend and to the workers' system ports, which listen on that host's
loopback. Child processes are started outside it, through ``Host.prefix()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.netns import Host
from harness.services import Services
from harness.topology import HOST, Proc, Stack

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(host: Host) -> Iterator[None]:
    """Run the block with this thread in ``host``'s network namespace; always returns."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{host.netns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


@dataclass
class HostServices(Services):
    """etcd + NATS on ``host``, listening on its address (the other host dials it)."""

    host: Host | None = None

    @property
    def address(self) -> str:
        return self.host.address

    def reach(self) -> contextlib.AbstractContextManager:
        return entered(self.host)

    def _spawn(self, name: str, argv: list[str]):
        return super()._spawn(name, [*self.host.prefix(), *argv])


@dataclass
class HostStack(Stack):
    """A Stack whose processes each run on a host: ``place[name]`` (else ``default``).

    ``bind`` is what every worker gets as ``--host``: "address" (its host's own address) or a
    wildcard such as "0.0.0.0"."""

    default: Host | None = None
    place: dict[str, Host] = field(default_factory=dict)
    bind: str = "address"
    worker_env: dict[str, str] = field(default_factory=dict)  # every process but the frontend
    prefill_ports: tuple[int, int] | None = None  # bootstrap, room watch: a restart reuses them

    def host_of(self, name: str) -> Host:
        return self.place.get(name, self.default)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str],
               system_port: int | None = None) -> Proc:
        host = self.host_of(name)
        # UCX's defaults unless a test sets one (worker_env): what the tests claim to work with.
        env = {k: v for k, v in env.items() if not k.startswith("UCX_")}
        # Dynamo's TCP response stream (worker -> frontend) must be dialable from the other host.
        env.update(DYN_TCP_RESPONSE_STREAM_HOST=host.address,
                   **(self.worker_env if name != "frontend" else {}))
        return super()._spawn(name, [*host.prefix(), *argv], env, system_port)

    def start_worker(self, name: str, mode: str, served_name: str, *extra: str,
                     **kwargs: Any) -> Proc:
        host = self.host_of(name)
        bind = host.address if self.bind == "address" else self.bind
        return super().start_worker(name, mode, served_name, *extra, "--host", bind, **kwargs)

    # HTTP to the frontend (host A's loopback) and to the workers' system ports (their host's).
    def models(self) -> list[str]:
        with entered(self.host_of("frontend")):
            return super().models()

    def answers(self, served_name: str) -> bool:
        with entered(self.host_of("frontend")):
            return super().answers(served_name)

    def route(self, name: str, route: str) -> dict[str, Any]:
        with entered(self.host_of(name)):
            return self.procs[name].engine_route(route)

    def call(self, fn, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)`` on the frontend's host (a client's requests)."""
        with entered(self.host_of("frontend")):
            return fn(*args, **kwargs)


def log_lines(path: Path, needle: str) -> list[str]:
    return [ln for ln in path.read_text(errors="replace").splitlines() if needle in ln]


__all__ = ["HOST", "HostServices", "HostStack", "entered", "log_lines"]
