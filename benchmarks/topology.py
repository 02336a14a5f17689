"""Start and stop a serving topology (frontend + workers) for a benchmark run.

The same processes `launch/agg.sh` and `launch/disagg.sh` start: `python -m dynamo.frontend` with
file discovery and `python -m components` workers on the CPU engine. Each process runs in its own
process group with its log in the run directory; `stop()` ends them all (TERM, bounded wait, KILL).
Ready = `/v1/models` lists the model and one short request succeeds (the decode worker may need a
moment to see its prefill peer). The run directory is removed on stop unless start-up failed or
BENCH_KEEP_LOGS=1.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.common import REPO_ROOT

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TopologySpec:
    name: str  # "agg" | "disagg"
    model_path: str
    served_model_name: str = "small"
    skip_tokenizer_init: bool = True  # Tokens mode: the frontend tokenizes (Dynamo's default path)
    worker_args: tuple[str, ...] = ()

    def roles(self) -> tuple[str, ...]:
        return ("null",) if self.name == "agg" else ("prefill", "decode")


@dataclass
class Topology:
    spec: TopologySpec
    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-topo-")))
    http_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    keep_logs: bool = field(default_factory=lambda: os.environ.get("BENCH_KEEP_LOGS") == "1")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DYN_FILE_KV": str(self.run_dir / "discovery"),  # private: no other run can see it
                "DYN_NAMESPACE": f"bench{self.spec.name}",
                "PYTHONPATH": str(REPO_ROOT),
                "OMP_NUM_THREADS": "1",
                "DYN_LOG": env.get("DYN_LOG", "warn"),
            }
        )
        return env

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.run_dir / f"{name}.log", "wb") as log:  # the child keeps its own fd
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _worker_argv(self, role: str) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "components",
            "--engine",
            "cpu",
            "--model-path",
            self.spec.model_path,
            "--served-model-name",
            self.spec.served_model_name,
            "--disaggregation-mode",
            role,
            "--host",
            "127.0.0.1",
            "--cpu-num-threads",
            "1",
            "--log-level",
            "warning",
        ]
        if self.spec.skip_tokenizer_init:
            argv.append("--skip-tokenizer-init")
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(free_port())]
        return argv + list(self.spec.worker_args)

    def start_processes(self) -> None:
        (self.run_dir / "discovery").mkdir(parents=True, exist_ok=True)
        self._spawn(
            "frontend",
            [
                sys.executable,
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.http_port),
                "--discovery-backend",
                "file",
            ],
        )
        for role in self.spec.roles():
            self._spawn(role if role != "null" else "agg", self._worker_argv(role))

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.keep_logs = True  # the error message points at them
            raise

    def start(self, timeout_s: float = 180.0) -> "Topology":
        self.start_processes()
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        body = {
            "model": self.spec.served_model_name,
            "max_tokens": 2,
            "stream": False,
            "messages": [{"role": "user", "content": "ready?"}],
        }
        last = "no answer yet"
        with httpx.Client(base_url=self.base_url, timeout=30.0) as http:
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    models = [m["id"] for m in http.get("/v1/models").json().get("data", [])]
                    if self.spec.served_model_name in models:
                        resp = http.post("/v1/chat/completions", json=body)
                        if resp.status_code == 200:
                            return
                        last = f"warm-up request: HTTP {resp.status_code} {resp.text[:200]}"
                except (httpx.HTTPError, ValueError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.5)  # polling a condition with a deadline
        raise TimeoutError(f"topology {self.spec.name} not ready: {last}; logs in {self.run_dir}")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.run_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode} during start-up:\n{tail}")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def stop(self, grace_s: float = 10.0) -> None:
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()
        if not self.keep_logs:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> "Topology":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
