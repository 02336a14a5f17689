"""The standard disaggregated topology split over two hosts (``harness/netns.py``), the layout
of a two-node deployment: etcd, NATS, the frontend, the decode worker and the aggregated
reference ``tiny-agg`` on host A; the prefill worker on host B. Discovery is etcd and the
request plane NATS (file discovery and loopback TCP do not cross hosts)."""

from __future__ import annotations

import itertools
from pathlib import Path

from harness.multihost import HostServices, HostStack
from harness.netns import Hosts
from harness.topology import free_port
from tests.support.topologies import (AGG, DISAGG, ENGINE_ARGS, SGLANG, start_decode,
                                      start_sglang_decode, start_sglang_prefill)

LEASE_TTL_S = "5"  # Dynamo's ETCD_LEASE_TTL: a killed worker's keys go within seconds
_NAMESPACES = itertools.count()


def start_services(workdir: Path, hosts: Hosts) -> HostServices:
    return HostServices(workdir, host=hosts[0]).start()


def start_split(workdir: Path, model_path: str, hosts: Hosts, services: HostServices,
                skip_tokenizer_init: bool, orchestrator: str, bind: str = "address",
                engine: str = "cpu", worker_args: tuple[str, ...] = (),
                env: dict[str, str] | None = None, ready_timeout: float = 300,
                probe: bool = True) -> HostStack:
    """Frontend, decode and ``tiny-agg`` on host A, prefill on host B; ready once one request
    went through the disaggregated model (with ``probe``; else once the frontend lists it). ``bind``: every worker's ``--host`` ("address": its
    host's own). ``env`` goes to the prefill and decode workers."""
    a, b = hosts[0], hosts[1]
    stack = HostStack(workdir, model_path, discovery_backend="etcd", request_plane="nats",
                      services_env={**services.env(), "ETCD_LEASE_TTL": LEASE_TTL_S},
                      # SGLang's workers name Dynamo's default namespace in their endpoints
                      namespace=None if engine == "sglang" else f"mh{next(_NAMESPACES)}",
                      default=a,
                      place={"prefill": b}, bind=bind, worker_env=dict(env or {}))
    served = SGLANG if engine == "sglang" else DISAGG
    try:
        stack.start_frontend()
        start_prefill_on(stack, "prefill", skip_tokenizer_init, orchestrator, engine,
                         worker_args)
        if engine == "sglang":
            start_sglang_decode(stack, "decode", skip_tokenizer_init, orchestrator, worker_args)
        else:
            start_decode(stack, "decode", skip_tokenizer_init, worker_args, orchestrator)
        stack.start_worker("agg", "null", AGG, *ENGINE_ARGS,
                           "--endpoint", f"dyn://{stack.namespace or 'dynamo'}.agg.generate",
                           skip_tokenizer_init=skip_tokenizer_init)
        stack.wait_ready(served, AGG, timeout=ready_timeout, probe=probe)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    return stack


def start_prefill_on(stack: HostStack, name: str, skip_tokenizer_init: bool, orchestrator: str,
                     engine: str = "cpu", worker_args: tuple[str, ...] = ()) -> None:
    """A prefill worker on the prefill's host. A replacement reuses the first one's bootstrap
    and room-watch ports: it comes back at the same address."""
    stack.place.setdefault(name, stack.place["prefill"])
    if stack.prefill_ports is None:
        stack.prefill_ports = (free_port(), free_port())
    bootstrap, watch = stack.prefill_ports
    if engine == "sglang":
        start_sglang_prefill(stack, name, skip_tokenizer_init, orchestrator,
                             (*worker_args, "--room-watch-port", str(watch)), bootstrap)
        return
    stack.start_worker(name, "prefill", DISAGG, *ENGINE_ARGS, *worker_args,
                       "--disaggregation-bootstrap-port", str(bootstrap),
                       "--room-watch-port", str(watch), "--disagg-orchestrator", orchestrator,
                       skip_tokenizer_init=skip_tokenizer_init)


__all__ = ["start_prefill_on", "start_services", "start_split"]
