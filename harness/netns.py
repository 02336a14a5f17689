"""Two "hosts" on one machine: network namespaces joined by a veth pair, each with its own
address, loopback, hostname and /etc/hosts, for the multi-host tests.

A host is a network namespace (``ip netns``); a process runs on it through
``ip netns exec NS unshare --uts sh -c 'hostname NAME; exec "$@"'``, so it sees only that host's
interfaces (its own ``lo`` and one veth end) and its own hostname. ``ip netns exec`` bind-mounts
``/etc/netns/NS/hosts`` over ``/etc/hosts``, which maps every host's name to its address (the
hostname a worker advertises must resolve to an address the other host can reach).

The addresses are a private /24 that exists only inside these namespaces; nothing is routed to
the machine's own interfaces. ``Hosts.remove`` deletes the namespaces (which deletes the veth
pair) and the /etc/netns entries, and is safe to call after a partial ``create``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.231.0"  # private, inside the namespaces only
NETNS_ETC = Path("/etc/netns")
CMD_TIMEOUT_S = 20.0


def unavailable() -> str | None:
    """Why namespaces cannot be made here (the tests skip with it), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=CMD_TIMEOUT_S,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@dataclass
class Host:
    name: str  # the hostname; also the suffix of the namespace's name
    netns: str
    address: str
    dev: str  # its end of the veth pair

    def prefix(self) -> list[str]:
        """argv prefix that runs a command on this host (its namespace, its hostname)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.name]

    def tx_bytes(self) -> int:
        """Bytes this host has sent over its veth end: what crossed the link."""
        out = subprocess.run(["ip", "netns", "exec", self.netns, "cat",
                              f"/sys/class/net/{self.dev}/statistics/tx_bytes"],
                             check=True, timeout=CMD_TIMEOUT_S, capture_output=True, text=True)
        return int(out.stdout)


@dataclass
class Hosts:
    """``count`` hosts named ``{tag}a``, ``{tag}b``, ...; the first is the hub of the veths."""

    tag: str = field(default_factory=lambda: f"mh{os.getpid()}")
    count: int = 2
    hosts: list[Host] = field(default_factory=list)

    def create(self) -> "Hosts":
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def _create(self) -> None:
        if self.count != 2:
            raise ValueError("one veth pair joins exactly two hosts")
        for i in range(self.count):
            name = f"{self.tag}{chr(ord('a') + i)}"
            host = Host(name, f"{name}-ns", f"{SUBNET}.{i + 1}", f"{name}-v")
            _ip("netns", "add", host.netns)
            self.hosts.append(host)
        a, b = self.hosts
        _ip("link", "add", a.dev, "type", "veth", "peer", "name", b.dev)
        for host in self.hosts:
            _ip("link", "set", host.dev, "netns", host.netns)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.dev)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "link", "set", host.dev, "up")
        lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in self.hosts]
        for host in self.hosts:
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(lines) + "\n")

    def remove(self) -> list[str]:
        """Delete every namespace and /etc/netns entry made; the errors, if any."""
        errors = []
        if self.hosts:  # a pair made but not yet moved into the namespaces lives here
            subprocess.run(["ip", "link", "delete", self.hosts[0].dev], timeout=CMD_TIMEOUT_S,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        for host in self.hosts:
            try:
                _ip("netns", "delete", host.netns)  # takes its veth end, and so the pair
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                errors.append(f"{host.netns}: {exc}")
            shutil.rmtree(NETNS_ETC / host.netns, ignore_errors=True)
        self.hosts = []
        return errors

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]
