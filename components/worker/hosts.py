"""Bind addresses: which ones mean "every interface", and what a peer should dial instead."""

from __future__ import annotations

import random
import socket

from components.backends.base import EngineBackend

WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def is_wildcard(host: str) -> bool:
    return host in WILDCARD_HOSTS


def advertised_host(host: str, backend: EngineBackend) -> str:
    """The address a decode engine should dial for this prefill's bootstrap server: the bind
    address, or this machine's address as the engine itself would advertise it when bound to a
    wildcard."""
    if not is_wildcard(host):
        return host
    return backend.local_ip()


def bind_address(host: str) -> tuple[socket.AddressFamily, str]:
    """(address family, address) a socket binds `host` with: an IPv6 literal (`::1`, also
    bracketed) needs an AF_INET6 socket, which an AF_INET one refuses."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (socket.AF_INET6 if ":" in bare else socket.AF_INET), bare


# Ports picked here for a process to bind later: below 32768 (Dynamo 1.6.1 parses
# DYN_SYSTEM_PORT as an i16, and Linux's ephemeral range starts there) and below 22000, where
# SGLang draws the torch.distributed port its scheduler binds only later (22000-29999).
SAFE_PORT_RANGE = (10000, 21999)


def free_system_port(host: str) -> int:
    """A free port on `host` for a Dynamo system port (SAFE_PORT_RANGE)."""
    return free_port_in(host, *SAFE_PORT_RANGE)


def free_port_in(host: str, low: int, high: int) -> int:
    """A port in [low, high] free on `host` right now, tried at random."""
    rng = random.Random()
    family, address = bind_address(host)
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high}] on {host}")
