"""The end-to-end topologies of the tests, on `harness.topology`.

The standard one serves the tiny model twice through one frontend: `tiny` by a decode worker with
a prefill worker behind it (disaggregated), and `tiny-agg` by an aggregated worker; the same
request to both must give the same greedy output. Used by `tests/e2e` and `tests/fuzz` (through
`tests/conftest.py`'s fixture). The SGLang one serves `tiny-sglang` on the real SGLang engine
(SGLang's CPU path), next to the CPU engine's `tiny-agg` as the reference.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Optional

from harness.services import Services
from harness.topology import Proc, Stack, free_port

DISAGG = "tiny"
_NAMESPACES = itertools.count()
AGG = "tiny-agg"
SGLANG = "tiny-sglang"
CONTEXT_LENGTH = 2048
PREFILL_WAIT_S = 5.0
# TEST_CPU_ENGINE_PROCESS=separate runs every CPU-engine worker of these topologies with its
# engine in a process of its own (--cpu-engine-process); unset, the worker's default.
ENGINE_PROCESS_ENV = "TEST_CPU_ENGINE_PROCESS"
ENGINE_PROCESS_ARGS = (("--cpu-engine-process", os.environ[ENGINE_PROCESS_ENV])
                       if os.environ.get(ENGINE_PROCESS_ENV) else ())
# Small pools and context keep start-up fast; page size 16 like the launch scripts.
ENGINE_ARGS = ("--context-length", str(CONTEXT_LENGTH), "--max-total-tokens", "65536",
               "--page-size", "16", "--max-running-requests", "32", *ENGINE_PROCESS_ARGS)


# Who starts a disaggregated request's prefill: the decode worker (the default here: Text mode
# needs it) or the frontend's prefill router (Dynamo 1.6.1's style, Tokens mode).
DECODE_ORCHESTRATED = "decode"
FRONTEND_ORCHESTRATED = "frontend"


def start_alone(stack: Stack, name: str, *args: str, engine: str = "cpu",
                env: Optional[dict[str, str]] = None) -> Proc:
    """An aggregated worker serving model `name` from a component of its own (one worker per
    model in a shared stack, so a test can stop or kill it alone)."""
    return stack.start_worker(name, "null", name, *args, "--endpoint",
                              f"dyn://dynamo.{name.replace('-', '_')}.generate",
                              engine=engine, env=env)


def start_prefill(stack: Stack, name: str, skip_tokenizer_init: bool,
                  extra: tuple[str, ...] = (), orchestrator: str = DECODE_ORCHESTRATED) -> None:
    stack.start_worker(name, "prefill", DISAGG, *ENGINE_ARGS, *extra,
                       "--disaggregation-bootstrap-port", str(free_port()),
                       "--disagg-orchestrator", orchestrator,
                       skip_tokenizer_init=skip_tokenizer_init)


def start_decode(stack: Stack, name: str, skip_tokenizer_init: bool,
                 extra: tuple[str, ...] = (), orchestrator: str = DECODE_ORCHESTRATED) -> None:
    stack.start_worker(name, "decode", DISAGG, *ENGINE_ARGS, *extra,
                       "--prefill-wait-timeout", str(PREFILL_WAIT_S),
                       "--disagg-orchestrator", orchestrator,
                       skip_tokenizer_init=skip_tokenizer_init)


def start_topology(workdir: Path, model_path: str, skip_tokenizer_init: bool,
                   with_agg: bool = True, prefill_args: tuple[str, ...] = (),
                   worker_args: tuple[str, ...] = (),
                   orchestrator: str = DECODE_ORCHESTRATED,
                   discovery: Optional[Services] = None) -> Stack:
    """The standard topology, ready; on failure its logs are printed and it is stopped.
    `worker_args` are appended to every worker's flags, then `prefill_args` to the first
    prefill worker's (later ones win). Frontend-orchestrated, ready also means one request went
    through: the frontend lists the model as soon as decode registers, but serves it only once
    a prefill worker has too. With `discovery` (running etcd + NATS servers) the processes find
    each other through etcd and talk over NATS instead of a file directory and TCP."""
    stack = Stack(workdir, model_path)
    if discovery is not None:  # one namespace per stack: stacks may share the servers
        # A short etcd lease (Dynamo's ETCD_LEASE_TTL, seconds): a killed worker's keys go soon.
        stack = Stack(workdir, model_path, discovery_backend="etcd", request_plane="nats",
                      services_env={**discovery.env(), "ETCD_LEASE_TTL": "5"},
                      namespace=f"ns{next(_NAMESPACES)}")
    try:
        stack.start_frontend()
        start_prefill(stack, "prefill", skip_tokenizer_init, (*worker_args, *prefill_args),
                      orchestrator)
        start_decode(stack, "decode", skip_tokenizer_init, worker_args, orchestrator)
        served = [DISAGG]
        if with_agg:
            stack.start_worker("agg", "null", AGG, *ENGINE_ARGS, *worker_args,
                               "--endpoint", f"dyn://{stack.namespace or 'dynamo'}.agg.generate",
                               skip_tokenizer_init=skip_tokenizer_init)
            served.append(AGG)
        stack.wait_ready(*served)
        if orchestrator == FRONTEND_ORCHESTRATED:
            stack.wait_ready(DISAGG, probe=True)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    return stack


# SGLang on CPU: an explicitly sized pool; its default page size (the resolved one is registered).
# Bounded JSON whitespace lets the random model's constrained output end (structured output tests).
# Every SGLang worker sleeps while idle (SGLang's --sleep-on-idle): on its CPU path an idle
# scheduler's main thread polls at up to a core, and a test module holds several engines on two
# cores. Prefill and decode schedulers also run NIXL's progress thread, which spins unless given
# a delay (tests/support/sglang_cpu/sitecustomize.py gives it one). Measured on SGLang 0.5.23's
# CPU path: an idle prefill + decode pair took 1.97 cores without either, 0.05 with both.
SGLANG_ENGINE_ARGS = ("--context-length", str(CONTEXT_LENGTH), "--max-total-tokens", "8192",
                      "--max-running-requests", "32", "--constrained-json-max-whitespace-cnt", "1",
                      "--sleep-on-idle")


def _sglang_disagg_args(orchestrator: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    return ("--disaggregation-transfer-backend", "nixl", "--disagg-orchestrator", orchestrator,
            *extra)


def start_sglang_prefill(stack: Stack, name: str, skip_tokenizer_init: bool, orchestrator: str,
                         extra: tuple[str, ...] = (), bootstrap_port: int = 0) -> None:
    """An SGLang prefill worker for `tiny-sglang` (a replacement too: its own bootstrap port
    unless given one; `extra` may name its room-watch port)."""
    stack.start_worker(name, "prefill", SGLANG, *SGLANG_ENGINE_ARGS,
                       *_sglang_disagg_args(orchestrator, extra),
                       "--endpoint", "dyn://dynamo.sglang_prefill.generate",
                       "--disaggregation-bootstrap-port", str(bootstrap_port or free_port()),
                       skip_tokenizer_init=skip_tokenizer_init, engine="sglang")


def start_sglang_decode(stack: Stack, name: str, skip_tokenizer_init: bool, orchestrator: str,
                        extra: tuple[str, ...] = ()) -> None:
    """An SGLang decode worker serving `tiny-sglang` (a replacement too)."""
    stack.start_worker(name, "decode", SGLANG, *SGLANG_ENGINE_ARGS,
                       *_sglang_disagg_args(orchestrator, extra),
                       "--endpoint", "dyn://dynamo.sglang.generate",
                       "--prefill-endpoint", "dyn://dynamo.sglang_prefill.generate",
                       skip_tokenizer_init=skip_tokenizer_init, engine="sglang")


def start_sglang_topology(workdir: Path, model_path: str, skip_tokenizer_init: bool,
                          disaggregated: bool = False,
                          orchestrator: str = DECODE_ORCHESTRATED, with_agg: bool = True,
                          extra: tuple[str, ...] = ()) -> Stack:
    """Frontend, SGLang serving `tiny-sglang` (one aggregated worker, or a prefill and a decode
    worker orchestrated by `orchestrator`), and the CPU engine's aggregated `tiny-agg` as the
    reference (`with_agg`). `extra` flags go to the SGLang workers (later flags win)."""
    stack = Stack(workdir, model_path)
    try:
        stack.start_frontend()
        endpoint = ("--endpoint", "dyn://dynamo.sglang.generate")
        if disaggregated:
            start_sglang_prefill(stack, "prefill", skip_tokenizer_init, orchestrator, extra)
            start_sglang_decode(stack, "sglang", skip_tokenizer_init, orchestrator, extra)
        else:
            stack.start_worker("sglang", "null", SGLANG, *SGLANG_ENGINE_ARGS, *endpoint, *extra,
                               skip_tokenizer_init=skip_tokenizer_init, engine="sglang")
        if with_agg:
            stack.start_worker("agg", "null", AGG, *ENGINE_ARGS,
                               "--endpoint", "dyn://dynamo.agg.generate",
                               skip_tokenizer_init=skip_tokenizer_init)
        stack.wait_ready(SGLANG, *([AGG] if with_agg else []))
        if disaggregated and orchestrator == FRONTEND_ORCHESTRATED:
            stack.wait_ready(SGLANG, probe=True)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    return stack
