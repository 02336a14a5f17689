"""The KV-routing topology of the test and the benchmark: `dynamo.frontend --router-mode <mode>`
and two aggregated workers that publish KV events (`--kv-events-config`), on `harness.topology`.

Each worker serves `/engine/prefix_cache` (`--debug-routes`), whose counters tell which worker
served a request from its cache."""

from __future__ import annotations

import logging
from pathlib import Path

from harness.topology import READY_TIMEOUT_S, Stack, wait_until

logger = logging.getLogger(__name__)

WORKERS = ("w0", "w1")
KV_EVENTS = '{"publisher": "zmq", "topic": "kv-events"}'
ROUTER_MODES = ("kv", "round-robin")


def start_kv_routed(workdir: Path, model_path: str, served: str, router_mode: str,
                    engine_args: tuple[str, ...], namespace: str | None = None,
                    wait: bool = True) -> Stack:
    """Frontend + two KV-event publishing aggregated workers serving `served`; ready unless
    `wait` is False. On a failed start the logs are printed and the stack stopped."""
    if router_mode not in ROUTER_MODES:
        raise ValueError(f"router_mode must be one of {ROUTER_MODES}, got {router_mode!r}")
    stack = Stack(workdir, model_path, namespace=namespace)
    try:
        stack.start_frontend("--router-mode", router_mode)
        for name in WORKERS:
            stack.start_worker(name, "null", served, *engine_args,
                               "--kv-events-config", KV_EVENTS)
        if wait:
            wait_ready(stack, served)
    except BaseException:
        logger.error("the KV-routed stack did not start:\n%s", stack.logs())
        stack.stop()
        raise
    return stack


def wait_ready(stack: Stack, served: str) -> None:
    """The model is listed once one worker registered; both must be up (their debug routes
    exist once their engines are built) before a test counts on either."""
    stack.wait_ready(served)
    wait_until(lambda: prefix_cache_stats(stack), READY_TIMEOUT_S,
               f"both workers' /engine/prefix_cache on {stack.url}", interval=0.5)


def prefix_cache_stats(stack: Stack) -> dict[str, dict[str, int]]:
    """Per worker: pages its prefix cache holds and prompt tokens it served from the cache."""
    return {name: stack.procs[name].engine_route("prefix_cache") for name in WORKERS}
