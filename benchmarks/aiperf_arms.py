"""The aiperf benchmark's arms: each a `python -m dynamo.frontend` with its workers, in a run
directory and discovery directory of its own.

- agg, disagg: this worker on its CPU engine (benchmarks/serving_arms.py's topologies);
- agg-sglang, disagg-sglang: this worker on the real `sglang.Engine` (`--engine sglang`);
- dynamo-sglang, dynamo-sglang-disagg: Dynamo 1.6.1's own SGLang worker (`python -m
  dynamo.sglang`), aggregated, and a prefill and a decode worker (frontend-orchestrated, the
  only style 1.6.1 has);
- sglang-native, sglang-native-disagg: SGLang's own server behind its gateway, smg
  (benchmarks/native_arms.py).
The SGLang arms run SGLang's CPU path with the test stand-ins (harness/topology.py's
`engine_env`), with the same engine flags for this worker and 1.6.1's, given explicitly so neither
worker's defaults decide them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.native_arms import NATIVE_ARMS, NativeArm, exactness_problems
from benchmarks.proc_tree_cpu import descendants
from benchmarks.serving_arms import spawn_topology
from harness.topology import Stack, free_port

logger = logging.getLogger("aiperf_arms")
ARMS = ("agg", "disagg", "agg-sglang", "disagg-sglang", "dynamo-sglang", "dynamo-sglang-disagg",
        *NATIVE_ARMS)
CPU_ARMS = ("agg", "disagg")
# Sized for concurrency 8 of 256 + 32 tokens (plus the chat template) with room to spare.
SGLANG_FLAGS = ("--skip-tokenizer-init", "--page-size", "16", "--max-total-tokens", "8192",
                "--context-length", "2048", "--max-running-requests", "8", "--host", "127.0.0.1",
                "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                "--dtype", "float32", "--log-level", "warning")
DISAGG = ("--disaggregation-transfer-backend", "nixl")
READY_S = 300.0  # several SGLang workers starting at once on 2 cores
# The arm the native arms' greedy answer is compared with at start-up (same engine and flags).
EXACT_REFERENCE = "agg-sglang"


def spawn_sglang(name: str, model_path: str, served: str, prefill_args: tuple[str, ...] = (),
                 decode_args: tuple[str, ...] = ()) -> Stack:
    """The SGLang arm `name`; `prefill_args` and `decode_args` go to its prefill and decode
    workers (disaggregated arms)."""
    stack = Stack(Path(tempfile.mkdtemp(prefix=f"aiperf-{name}-")), model_path,
                  namespace=f"aiperf{name.replace('-', '')}")
    stack.start_frontend()
    if name == "dynamo-sglang":
        stack.start_dynamo_sglang("worker", "--served-model-name", served, *SGLANG_FLAGS)
    elif name == "dynamo-sglang-disagg":
        for role in ("prefill", "decode"):
            # This worker sets the decode's retraction backup itself on SGLang's CPU path (its
            # host pool calls into CUDA); 1.6.1's must be given it. 1.6.1's prefill advertises
            # SGLANG_HOST_IP (else the machine's address) as its bootstrap host, and SGLang's
            # bootstrap server listens on --host only.
            own = (("--disaggregation-bootstrap-port", str(free_port()), *prefill_args)
                   if role == "prefill"
                   else ("--disaggregation-decode-retraction-backup", "none", *decode_args))
            stack.start_dynamo_sglang(role, "--served-model-name", served, *SGLANG_FLAGS,
                                      *DISAGG, "--disaggregation-mode", role, *own,
                                      SGLANG_HOST_IP="127.0.0.1")
    elif name == "agg-sglang":
        stack.start_worker("worker", "null", served, *SGLANG_FLAGS, engine="sglang")
    else:
        stack.start_worker("prefill", "prefill", served, *SGLANG_FLAGS, *DISAGG, *prefill_args,
                           "--disaggregation-bootstrap-port", str(free_port()), engine="sglang")
        stack.start_worker("decode", "decode", served, *SGLANG_FLAGS, *DISAGG, *decode_args,
                           engine="sglang")
    return stack


class AiperfArms:
    """Started arms by name; `worker_pids(name)` are the roots of its workers' process trees."""

    def __init__(self, arms: list[str], model_path: str, keep_logs: bool) -> None:
        self.names, self.model_path, self.keep_logs = arms, model_path, keep_logs
        self.served = Path(model_path).name
        self.stacks: dict[str, Stack | NativeArm] = {}

    def start(self) -> None:
        # Spawn every arm first so their start-ups overlap, then wait for each.
        try:
            for name in self.names:
                self.stacks[name] = self._spawn(name)
            for stack in self.stacks.values():
                # The probe: a decode worker is listed before it has found its prefill peer.
                stack.wait_ready(self.served, timeout=READY_S, probe=True)
            self._check_exact()
        except BaseException:
            self.keep_logs = True  # the error points at them
            raise

    def _spawn(self, name: str) -> Stack | NativeArm:
        if name in CPU_ARMS:
            return spawn_topology(name, self.model_path, self.served, True)
        if name in NATIVE_ARMS:
            arm = NativeArm(name, self.model_path, self.served, SGLANG_FLAGS, DISAGG)
            arm.start()
            return arm
        return spawn_sglang(name, self.model_path, self.served)

    def _check_exact(self) -> None:
        """The native arms must answer a greedy request token for token as agg-sglang does (the
        integrity checks only count completed requests)."""
        native = [n for n in self.names if n in NATIVE_ARMS]
        if not native:
            return
        if EXACT_REFERENCE not in self.stacks:
            logger.warning("no %s arm: the native arms' greedy answers are not compared",
                           EXACT_REFERENCE)
            return
        urls = {n: self.url(n) for n in (EXACT_REFERENCE, *native)}
        problems = exactness_problems(urls, self.served, EXACT_REFERENCE)
        if problems:
            raise RuntimeError("greedy answers differ: " + "; ".join(problems))

    def url(self, name: str) -> str:
        return self.stacks[name].url

    def worker_roots(self, name: str) -> dict[str, int]:
        """Worker process name ("worker", "prefill", "decode") -> pid, alike in every arm."""
        return {n: p.popen.pid for n, p in self.stacks[name].procs.items() if n != "frontend"}

    def worker_pids(self, name: str) -> list[int]:
        return list(self.worker_roots(name).values())

    def engine_subprocesses(self, name: str) -> list[int]:
        """The SGLang scheduler and detokenizer processes under the arm's workers."""
        out = []
        for pid in descendants(self.worker_pids(name)):
            try:
                if Path(f"/proc/{pid}/comm").read_text().startswith("sglang::"):
                    out.append(pid)
            except OSError:  # exited meanwhile
                continue
        return out

    @contextmanager
    def only(self, name: str) -> Iterator[Callable[[], None]]:
        """Freeze every arm's SGLang engine processes; yield `thaw`, which resumes `name`'s.

        Idle, SGLang's disaggregated schedulers keep polling (their event loop and NIXL's UCX
        threads): on 2 cores, four of them take the whole machine from the arm being measured,
        and the measured arm's own take it from aiperf's set-up (tokenizer, synthetic dataset:
        ~35 s instead of ~6 s), so the caller thaws that arm only when aiperf is ready to
        send. Only those processes stop (SIGSTOP): the worker processes keep their discovery
        registrations alive, and the frontends keep serving (a whole arm stopped past the
        file discovery's time-to-live loses its registrations).
        """
        frozen = {arm: self.engine_subprocesses(arm) for arm in self.stacks}
        for pids in frozen.values():
            _signal(pids, signal.SIGSTOP)
        try:
            yield lambda: _signal(frozen.pop(name, []), signal.SIGCONT)
        finally:
            for pids in frozen.values():
                _signal(pids, signal.SIGCONT)

    def stop(self) -> list[str]:
        """Stop every arm; the run directories kept (their logs), if any."""
        kept = []
        for stack in self.stacks.values():
            stack.stop()
            if self.keep_logs:
                kept.append(str(stack.workdir))
            else:
                shutil.rmtree(stack.workdir, ignore_errors=True)
        return kept


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # exited meanwhile
            continue
