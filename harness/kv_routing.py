"""The KV-routing topologies of the test and the benchmark: `dynamo.frontend --router-mode <mode>`
on `harness.topology`, with workers that publish KV events (`--kv-events-config`):

- aggregated: two aggregated workers;
- disaggregated (frontend-orchestrated, Dynamo 1.6.1's style): two prefill workers, which the
  frontend's prefill router picks by their cached blocks, and one decode worker, which keeps no
  prefix cache and publishes nothing.

Each worker serves `/engine/prefix_cache` (`--debug-routes`), whose counters tell which worker
served a request from its cache (CPU engine); `prefill_requests` tells which prefill worker took
a request on either engine."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.topology import HOST, READY_TIMEOUT_S, Stack, free_port, wait_until

logger = logging.getLogger(__name__)

WORKERS = ("w0", "w1")
PREFILLS = ("p0", "p1")
DECODE = "d0"
KV_EVENTS = '{"publisher": "zmq", "topic": "kv-events"}'
ROUTER_MODES = ("kv", "round-robin")


def kv_events_config() -> str:
    """Each worker's own ZMQ port: SGLang's scheduler binds it (DP rank r: port + r; one rank
    here); the CPU engine ignores it. A wildcard host, so SGLang binds rather than connects."""
    return json.dumps({**json.loads(KV_EVENTS), "endpoint": f"tcp://*:{free_port()}"})


def start_kv_routed(workdir: Path, model_path: str, served: str, router_mode: str,
                    engine_args: tuple[str, ...], namespace: str | None = None,
                    wait: bool = True) -> Stack:
    """Frontend + two KV-event publishing aggregated workers serving `served`; ready unless
    `wait` is False. On a failed start the logs are printed and the stack stopped."""
    _check_mode(router_mode)
    stack = Stack(workdir, model_path, namespace=namespace)
    with stopped_on_failure(stack, "the KV-routed stack"):
        stack.start_frontend("--router-mode", router_mode)
        for name in WORKERS:
            stack.start_worker(name, "null", served, *engine_args,
                               "--kv-events-config", KV_EVENTS)
        if wait:
            wait_ready(stack, served)
    return stack


def start_kv_routed_disagg(workdir: Path, model_path: str, served: str, router_mode: str,
                           engine_args: tuple[str, ...], engine: str = "cpu",
                           namespace: str | None = None, wait: bool = True) -> Stack:
    """Frontend + two KV-event publishing prefill workers + one decode worker serving `served`,
    frontend-orchestrated (Tokens mode); ready (one request through) unless `wait` is False."""
    _check_mode(router_mode)
    stack = Stack(workdir, model_path, namespace=namespace)
    disagg = ("--disagg-orchestrator", "frontend", "--disaggregation-transfer-backend", "nixl")
    with stopped_on_failure(stack, "the KV-routed disaggregated stack"):
        stack.start_frontend("--router-mode", router_mode)
        for name in PREFILLS:  # default endpoints: $DYN_NAMESPACE.prefill / .backend
            stack.start_worker(name, "prefill", served, *engine_args, *disagg,
                               "--disaggregation-bootstrap-port", str(free_port()),
                               "--kv-events-config", kv_events_config(), engine=engine)
        stack.start_worker(DECODE, "decode", served, *engine_args, *disagg, engine=engine)
        if wait:
            wait_ready_disagg(stack, served)
    return stack


@contextlib.contextmanager
def stopped_on_failure(stack: Stack, what: str) -> Iterator[None]:
    """A failed start logs the processes' output and stops what did start."""
    try:
        yield
    except BaseException:
        logger.error("%s did not start:\n%s", what, stack.logs())
        stack.stop()
        raise


def _check_mode(router_mode: str) -> None:
    if router_mode not in ROUTER_MODES:
        raise ValueError(f"router_mode must be one of {ROUTER_MODES}, got {router_mode!r}")


def wait_ready(stack: Stack, served: str) -> None:
    """The model is listed once one worker registered; both must be up (their debug routes
    exist once their engines are built) before a test counts on either."""
    stack.wait_ready(served)
    wait_until(lambda: alive_then(stack, lambda: prefix_cache_stats(stack)), READY_TIMEOUT_S,
               f"both workers' /engine/prefix_cache on {stack.url}", interval=0.5)


def wait_ready_disagg(stack: Stack, served: str) -> None:
    """Every worker's debug routes answer (engines built), then one request goes through: the
    frontend lists the model once decode registers, but serves it only with a prefill too."""
    wait_until(lambda: alive_then(stack, lambda: prefix_cache_stats(stack, (*PREFILLS, DECODE))),
               READY_TIMEOUT_S,
               f"every worker's /engine/prefix_cache on {stack.url}", interval=0.5)
    stack.wait_ready(served, probe=True)


def alive_then(stack: Stack, probe: Callable[[], Any]) -> Any:
    """`probe()`, after checking that no process exited: a worker that failed to start fails
    the wait at once, with its output, instead of at the timeout."""
    stack.check_alive()
    return probe()


def prefill_requests(stack: Stack, names: tuple[str, ...] = PREFILLS) -> dict[str, float]:
    """Per prefill worker (or the workers `names`): requests its `generate` endpoint has taken
    (Dynamo's own counter on its system port's /metrics), which tells which worker served a
    request on either engine."""
    out = {}
    for name in names:
        text = httpx.get(f"http://{HOST}:{stack.procs[name].system_port}/metrics",
                         timeout=5).text
        out[name] = sum(s.value for family in text_string_to_metric_families(text)
                        for s in family.samples
                        if s.name == "dynamo_component_requests_total"
                        and s.labels.get("dynamo_endpoint") == "generate")
    return out


def prefix_cache_stats(stack: Stack, names: tuple[str, ...] | None = None
                       ) -> dict[str, dict[str, int]]:
    """Per worker (the aggregated ones, or the prefill ones of a disaggregated stack): pages its
    prefix cache holds and prompt tokens it served from the cache (None on SGLang)."""
    if names is None:
        names = PREFILLS if PREFILLS[0] in stack.procs else WORKERS
    return {name: stack.procs[name].engine_route("prefix_cache") for name in names}
