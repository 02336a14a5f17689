"""Start and stop real topologies for the tests and benchmarks: `python -m dynamo.frontend` plus
worker processes (`python -m components`) on the embedded CPU engine or on the real SGLang engine
(SGLang's own CPU path), sharing a private file-discovery directory (the processes
`launch/agg.sh` and `launch/disagg.sh` start).

Each process runs in its own process group with its output in a log file under the stack's
directory; stopping sends SIGTERM to a group, waits a bounded time, then SIGKILLs it. Ready means
the frontend lists every served model and, with ``probe``, that one short request to each of them
succeeds (a decode worker may be listed before it has found its prefill peer).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from components.worker import hosts
from harness.child import REPO
from harness.zygote import ZYGOTES

HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 30.0  # one 2-token request; a cold worker compiles nothing, but the box is busy
# The test-only stand-ins and import hook that let SGLang run on CPU; only SGLang workers get it.
SGLANG_CPU_PATH = REPO / "tests" / "support" / "sglang_cpu"


def engine_argv(engine: str) -> list[str]:
    if engine == "sglang":
        return ["--engine", "sglang"]
    return ["--engine", "cpu", "--cpu-num-threads", "1"]


def engine_env(engine: str, sglang_cpu: bool = True) -> dict[str, str]:
    """SGLang on CPU: SGLang's own switch, and the stand-ins on the path of this process and the
    scheduler processes SGLang spawns from it (they inherit PYTHONPATH and load sitecustomize).
    SGLang on CUDA (`sglang_cpu` false) gets neither: it runs as installed."""
    if engine != "sglang" or not sglang_cpu:
        return {}
    path = os.pathsep.join(p for p in (str(SGLANG_CPU_PATH), os.environ.get("PYTHONPATH")) if p)
    return {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path}


def strip_sglang_cpu(env: dict[str, str]) -> None:
    """SGLang on CUDA: drop the CPU switch and stand-ins a CPU test run may have left in `env`."""
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    path = env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p and p != str(SGLANG_CPU_PATH))


# The ports handed out here lie below Linux's ephemeral range (32768-60999) and below SGLang's own
# picks (its --port, 30000, plus offsets; its torch.distributed port, drawn from 22000-29999 and
# bound only later by its scheduler: seen taken by a port handed out here, "EADDRINUSE"). A port
# found by binding port 0 is ephemeral: any outbound connection, or another engine binding port
# 0, may take it before the process it was meant for binds it (seen: an SGLang scheduler's KV
# events socket, "Address already in use").
def _worker_range(low: int, high: int, worker: str, workers: str) -> tuple[int, int]:
    """The share of [low, high] of one pytest-xdist worker ("gw1" of 2), so that two test
    processes never hand out the same port between its pick and its bind."""
    if not worker.startswith("gw") or not workers.isdigit():
        return low, high
    index, count = int(worker[2:]), int(workers)
    size = (high - low + 1) // count
    return low + index * size, low + (index + 1) * size - 1


PORT_RANGE = _worker_range(*hosts.SAFE_PORT_RANGE, os.environ.get("PYTEST_XDIST_WORKER", ""),
                           os.environ.get("PYTEST_XDIST_WORKER_COUNT", ""))


# Every port handed out by this process. A port is free when picked but bound only once its
# process is up (seconds later): picked again meanwhile, two processes would get it (seen: two
# prefill workers' bootstrap ports, "Address already in use").
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    for _ in range(100):
        port = hosts.free_port_in(HOST, *PORT_RANGE)
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no port in {PORT_RANGE} left that this process has not handed out")


def free_system_port() -> int:  # Dynamo's system ports must lie in SAFE_PORT_RANGE too
    return free_port()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError) as exc:
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    system_port: int | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the group, wait up to `timeout` s, then SIGKILL; the exit code."""
        self.signal_group(signal.SIGTERM)
        return self.reap(timeout)

    def reap(self, timeout: float) -> int | None:
        """Wait up to `timeout` s for an exit already asked for, then SIGKILL the group."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            return self.popen.wait(5)
        finally:
            self.signal_group(signal.SIGKILL)  # stragglers left in the group

    def kv_pages_in_use(self) -> int:
        return int(self.engine_route("kv_pages")["pages_in_use"])

    def requests_in_flight(self) -> int:
        return int(self.engine_route("requests")["in_flight"])

    def engine_route(self, name: str) -> dict[str, Any]:
        r = httpx.get(f"http://{HOST}:{self.system_port}/engine/{name}", timeout=5)
        r.raise_for_status()
        return r.json()


def stop_together(procs: Iterable[Proc], timeout: float) -> None:
    """SIGTERM every group at once, then give them `timeout` s in all before SIGKILL."""
    procs = list(procs)
    for proc in procs:
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.reap(max(0.0, deadline - time.monotonic()))


@dataclass
class Stack:
    """One frontend and any number of workers sharing a discovery directory under `workdir`.

    `namespace` sets DYN_NAMESPACE for every process (workers' default endpoints live there)."""

    workdir: Path
    model_path: str
    procs: dict[str, Proc] = field(default_factory=dict)
    http_port: int = field(default_factory=free_port)
    namespace: str | None = None
    # Dynamo's discovery backend and request plane for every process; etcd and NATS are reached
    # through `services_env` (ETCD_ENDPOINTS, NATS_SERVER: `harness.services`).
    discovery_backend: str = "file"
    request_plane: str = "tcp"
    services_env: dict[str, str] = field(default_factory=dict)
    # SGLang workers on SGLang's CPU path with the test-only stand-ins (the default), or, false,
    # on CUDA as installed (the GPU tier, tests/gpu), whatever this process's environment says.
    sglang_cpu: bool = True

    def __post_init__(self) -> None:
        self.kv_dir = self.workdir / "discovery"
        self.kv_dir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DYN_FILE_KV=str(self.kv_dir), DYN_DISCOVERY_BACKEND=self.discovery_backend,
                   DYN_REQUEST_PLANE=self.request_plane, DYN_SYSTEM_HOST=HOST,
                   DYN_TCP_RESPONSE_STREAM_HOST=HOST, DYN_LOG=os.environ.get("DYN_LOG", "warn"),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   # No grace period on SIGTERM (Dynamo's 5 s default): stacks stop often here;
                   # tests of the grace period set it themselves.
                   DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS="0")
        if self.namespace:
            env["DYN_NAMESPACE"] = self.namespace
        env.update(self.services_env)
        env.update(extra)
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str],
               system_port: int | None = None) -> Proc:
        log_path = self.workdir / f"{name}.log"
        popen = ZYGOTES.spawn(argv, env, REPO, log_path)  # tests only (harness/zygote.py)
        if popen is None:
            with open(log_path, "ab") as log:  # the child keeps its own descriptor
                popen = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(name, popen, log_path, system_port)
        self.procs[name] = proc
        return proc

    def start_frontend(self, *extra: str) -> Proc:
        argv = [sys.executable, "-m", "dynamo.frontend",
                "--discovery-backend", self.discovery_backend, "--request-plane", self.request_plane,
                "--http-host", HOST, "--http-port", str(self.http_port), *extra]
        return self._spawn("frontend", argv, self.env())

    def start_worker(self, name: str, mode: str, served_name: str, *extra: str,
                     skip_tokenizer_init: bool = True, engine: str = "cpu",
                     env: dict[str, str] | None = None) -> Proc:
        system_port = free_system_port()
        argv = [sys.executable, "-m", "components", *engine_argv(engine),
                "--model-path", self.model_path, "--served-model-name", served_name,
                "--host", HOST, "--disaggregation-mode", mode, "--debug-routes", *extra]
        if skip_tokenizer_init:
            argv.append("--skip-tokenizer-init")
        env = self.env(DYN_SYSTEM_PORT=str(system_port), **engine_env(engine, self.sglang_cpu),
                       **(env or {}))
        if engine == "sglang" and not self.sglang_cpu:
            strip_sglang_cpu(env)
        return self._spawn(name, argv, env, system_port)

    def start_dynamo_sglang(self, name: str, *args: str, **extra_env: str) -> Proc:
        """Dynamo 1.6.1's own SGLang worker (`python -m dynamo.sglang`) on SGLang's CPU path with
        the stand-ins `--engine sglang` workers get: the reference of the parity tests."""
        system_port = free_system_port()
        argv = [sys.executable, "-m", "dynamo.sglang", "--model-path", self.model_path, *args]
        env = self.env(DYN_SYSTEM_PORT=str(system_port), **engine_env("sglang"), **extra_env)
        return self._spawn(name, argv, env, system_port)

    def models(self) -> list[str]:
        r = httpx.get(f"{self.url}/v1/models", timeout=5)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]

    def model_card(self, served_name: str) -> dict[str, Any]:
        """The model card a worker registered, as file discovery stores it."""
        for path in (self.kv_dir / "v1" / "mdc").iterdir():
            card = json.loads(path.read_text())["card_json"]
            if card["display_name"] == served_name:
                return card
        raise KeyError(f"no model card for {served_name} in {self.kv_dir}")

    def answers(self, served_name: str) -> bool:
        """One 2-token chat to `served_name` succeeds; raises on any other status."""
        body = {"model": served_name, "max_tokens": 2, "stream": False,
                "messages": [{"role": "user", "content": "ready?"}]}
        r = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=PROBE_TIMEOUT_S)
        r.raise_for_status()
        return True

    def wait_ready(self, *served_names: str, timeout: float = READY_TIMEOUT_S,
                   probe: bool = False) -> None:
        def ready() -> bool:
            self.check_alive()
            if not set(served_names) <= set(self.models()):
                return False
            return not probe or all(self.answers(name) for name in served_names)

        wait_until(ready, timeout, f"models {served_names} on {self.url}", interval=0.5)

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n"
                                   + proc.log_text()[-4000:])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        # Workers first, so the frontend never routes to a half-stopped worker.
        stop_together((p for n, p in self.procs.items() if n != "frontend"), timeout)
        if "frontend" in self.procs:
            self.procs["frontend"].stop(timeout)

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log_text()[-3000:]}" for p in self.procs.values())
