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


def free_system_port(host: str) -> int:
    """A free port below 32768 on `host`: Dynamo 1.6.1 parses DYN_SYSTEM_PORT as an i16."""
    return free_port_in(host, 20000, 32767)


def free_port_in(host: str, low: int, high: int) -> int:
    """A port in [low, high] free on `host` right now, tried at random."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high}] on {host}")
