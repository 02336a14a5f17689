"""SGLang's own serving as arms of the aiperf benchmark: what a user who runs SGLang without
Dynamo gets.

- sglang-native: one `python -m sglang.launch_server` behind the Shepherd Model Gateway
  (`smg launch --worker-urls URL`);
- sglang-native-disagg: a prefill and a decode `sglang.launch_server` (NIXL) behind
  `smg launch --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`.

The servers get the engine flags of the other SGLang arms (benchmarks/aiperf_arms.py's
SGLANG_FLAGS) except `--skip-tokenizer-init`: SGLang's own server tokenizes. They run with
.venv's Python on SGLang's CPU path with the test stand-ins (harness/topology.py's `engine_env`);
smg runs from its own environment (`make bench` -> .venv-smg, requirements/smg.txt).
An arm looks like a `harness.topology.Stack` to AiperfArms (`url`, `procs`, `wait_ready`, `stop`,
`workdir`); the router is its "frontend" process, so that, like Dynamo's frontend in the other
arms, its CPU is not counted as the workers'.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import REPO_ROOT
from harness.topology import (HOST, PROBE_TIMEOUT_S, STOP_TIMEOUT_S, Proc, engine_env,
                              free_port, stop_together, wait_until)

logger = logging.getLogger("native_arms")
NATIVE_ARMS = ("sglang-native", "sglang-native-disagg")
SMG = REPO_ROOT / ".venv-smg" / "bin" / "smg"
# One greedy request that every arm must answer with the same tokens.
EXACT_PROMPT = "Compare the arms: say something."
EXACT_TOKENS = 16


def missing_tools() -> str | None:
    """What the native arms lack here and how to install it, or None."""
    if not SMG.exists():
        return f"{SMG} missing: run `make smg`"
    if importlib.util.find_spec("soundfile") is None:  # SGLang's server imports it
        return "soundfile missing in .venv: run `make bench-deps`"
    return None


def native_flags(sglang_flags: tuple[str, ...]) -> list[str]:
    return [f for f in sglang_flags if f != "--skip-tokenizer-init"]


def server_argv(model_path: str, served: str, port: int, flags: list[str],
                *extra: str) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
            "--served-model-name", served, "--port", str(port), *flags, *extra]


def smg_argv(port: int, metrics_port: int, *, worker: str | None = None,
             prefill: tuple[str, int] | None = None, decode: str | None = None,
             smg: Path = SMG) -> list[str]:
    """The gateway in front of one aggregated `worker`, or of a `prefill` (URL, bootstrap port)
    and a `decode` URL."""
    if worker is not None:
        workers = ["--worker-urls", worker]
    elif prefill is not None and decode is not None:
        workers = ["--pd-disaggregation", "--prefill", prefill[0], str(prefill[1]),
                   "--decode", decode]
    else:
        raise ValueError("smg needs a worker, or a prefill and a decode")
    # No health probes: SGLang's /health runs a generation, which hangs while the benchmark
    # holds this arm's scheduler stopped (AiperfArms.only) and would mark the worker unhealthy.
    return [str(smg), "launch", *workers, "--host", HOST, "--port", str(port),
            "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
            "--disable-health-check", "--log-level", "warn"]


class NativeArm:
    """One native arm's processes (each in its own process group, logs under `workdir`)."""

    def __init__(self, name: str, model_path: str, served: str,
                 sglang_flags: tuple[str, ...], disagg_flags: tuple[str, ...]) -> None:
        self.name, self.model_path, self.served = name, model_path, served
        self.flags = native_flags(sglang_flags)
        self.disagg_flags = list(disagg_flags)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"aiperf-{name}-"))
        self.procs: dict[str, Proc] = {}
        self.http_port = free_port()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def argvs(self) -> dict[str, list[str]]:
        """Process name -> command line; ports drawn here."""
        def server(port: int, *extra: str) -> list[str]:
            return server_argv(self.model_path, self.served, port, self.flags, *extra)

        worker_port, metrics_port = free_port(), free_port()
        if self.name == "sglang-native":
            return {"worker": server(worker_port),
                    "frontend": smg_argv(self.http_port, metrics_port,
                                         worker=f"http://{HOST}:{worker_port}")}
        decode_port, bootstrap = free_port(), free_port()
        # The decode's retraction backup: as for 1.6.1's decode worker (aiperf_arms.py), SGLang's
        # host pool calls into CUDA on its CPU path.
        return {
            "prefill": server(worker_port, *self.disagg_flags, "--disaggregation-mode", "prefill",
                              "--disaggregation-bootstrap-port", str(bootstrap)),
            "decode": server(decode_port, *self.disagg_flags, "--disaggregation-mode", "decode",
                             "--disaggregation-decode-retraction-backup", "none"),
            "frontend": smg_argv(self.http_port, metrics_port,
                                 prefill=(f"http://{HOST}:{worker_port}", bootstrap),
                                 decode=f"http://{HOST}:{decode_port}")}

    def env(self) -> dict[str, str]:
        # SGLANG_HOST_IP: the address the prefill advertises for its bootstrap and NIXL side.
        return {**os.environ, **engine_env("sglang"), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", "SGLANG_HOST_IP": HOST}

    def start(self) -> None:
        env = self.env()
        for name, argv in self.argvs().items():
            log_path = self.workdir / f"{name}.log"
            with open(log_path, "ab") as log:  # the child keeps its own descriptor
                popen = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            self.procs[name] = Proc(name, popen, log_path)

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if not proc.alive():
                raise RuntimeError(f"{self.name} {proc.name} exited with "
                                   f"{proc.popen.returncode}:\n{proc.log_text()[-4000:]}")

    def models(self) -> list[str]:
        r = httpx.get(f"{self.url}/v1/models", timeout=5)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]

    def wait_ready(self, served: str, timeout: float, probe: bool = True) -> None:
        """The gateway lists the model (its workers registered) and, with `probe`, one greedy
        chat through it succeeds (a PD pair answers only once the decode reached the prefill)."""
        def ready() -> bool:
            self.check_alive()
            if served not in self.models():
                return False
            return not probe or bool(greedy_answer(self.url, served, native=True))

        wait_until(ready, timeout, f"{self.name} on {self.url}", interval=0.5)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        # Workers first, so the gateway never routes to a half-stopped worker.
        stop_together((p for n, p in self.procs.items() if n != "frontend"), timeout)
        if "frontend" in self.procs:
            self.procs["frontend"].stop(timeout)


def greedy_answer(url: str, served: str, native: bool) -> dict[str, Any]:
    """One greedy chat's answer: its token ids (SGLang's server: `return_token_ids` ->
    `response_token_ids`; Dynamo's frontend, which refuses unknown fields:
    `nvext.completion_token_ids`), None where the answer lacks them, and its text."""
    extra = ({"return_token_ids": True} if native
             else {"nvext": {"extra_fields": ["completion_token_ids"]}})
    body = {"model": served, "max_tokens": EXACT_TOKENS, "temperature": 0.0, "stream": False,
            "messages": [{"role": "user", "content": EXACT_PROMPT}], **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=PROBE_TIMEOUT_S)
    r.raise_for_status()  # an httpx.HTTPError: the readiness wait retries on it
    data = r.json()
    choice = data["choices"][0]
    ids = choice.get("response_token_ids") or (data.get("nvext") or {}).get("completion_token_ids")
    return {"token_ids": ids, "text": choice["message"]["content"]}


def exactness_problems(urls: dict[str, str], served: str, reference: str) -> list[str]:
    """Each arm's greedy answer against the `reference` arm's: token ids where both have them,
    else text. Empty when all agree."""
    answers, problems = {}, []
    for name, url in urls.items():
        try:
            answers[name] = greedy_answer(url, served, name in NATIVE_ARMS)
        except httpx.HTTPStatusError as exc:
            problems.append(f"{name}: {exc.response.status_code} {exc.response.text[:300]}")
    ref = answers.get(reference)
    if ref is None:
        return problems
    for name, got in answers.items():
        key = "token_ids" if got["token_ids"] and ref["token_ids"] else "text"
        if got[key] != ref[key]:
            problems.append(f"{name} answered {got[key]!r}, {reference} {ref[key]!r} ({key})")
        else:
            logger.info("greedy answer of %s == %s's (%s: %r)", name, reference, key, got[key])
    return problems
