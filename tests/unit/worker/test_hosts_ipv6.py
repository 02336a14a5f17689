"""A literal IPv6 `--host` (`::1`, the `::` wildcard) gets its free ports as an IPv4 one does:
the pickers bind an AF_INET6 socket for it."""

from __future__ import annotations

import socket

import pytest

from components.backends import select as backend_select
from components.worker.flags.config import parse_args
from components.worker.hosts import bind_address, free_port_in, free_system_port

pytestmark = pytest.mark.timeout(30)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", (socket.AF_INET, "127.0.0.1")), ("::1", (socket.AF_INET6, "::1")),
    ("[::1]", (socket.AF_INET6, "::1")), ("::", (socket.AF_INET6, "::")),
])
def test_the_family_follows_the_literal(host, expected):
    assert bind_address(host) == expected


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "::"])
def test_the_port_pickers_take_an_ipv6_host(host):
    port = free_port_in(host, 20000, 32767)
    assert 20000 <= port <= 32767
    assert free_system_port(host) <= 32767
    with socket.socket(socket.AF_INET6) as s:  # free, as picked
        s.bind((host, port))


@needs_ipv6
def test_a_worker_on_an_ipv6_host_gets_a_bootstrap_port(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    config = parse_args(["--engine", "cpu", "--model-path", "/models/tiny", "--host", "::1"])
    assert config.host == "::1" and config.bootstrap_port > 0
