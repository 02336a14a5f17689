"""Disaggregated stacks whose decode workers keep a prefix cache
(`--disaggregation-decode-enable-radix-cache`), for the test and the multi-turn benchmark:
`dynamo.frontend --router-mode kv`, one prefill worker, the decode workers, and an aggregated
worker serving the same model under another name as the reference.

- decode-orchestrated: two decode workers, which register as aggregated workers and publish their
  cache's KV events, so the frontend's KV router sends a conversation's next turn to the decode
  that holds its history;
- frontend-orchestrated: one decode worker (Dynamo 1.6.1's frontend picks the decode by load).

Every worker serves `/engine/prefix_cache` (`--debug-routes`): a decode's `hit_tokens` are the
prompt tokens it did not need from the prefill."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from harness.kv_routing import alive_then, stopped_on_failure, kv_events_config
from harness.topology import READY_TIMEOUT_S, Stack, free_port, wait_until
from harness.worker_metrics import PREFIX, scrape

PREFILL = "p0"
DECODES = ("d0", "d1")
AGG_WORKER = "agg"
DECODE_CACHE = ("--disaggregation-decode-enable-radix-cache",)
STYLES = ("decode", "frontend")


def decodes_of(style: str) -> tuple[str, ...]:
    return DECODES if style == "decode" else DECODES[:1]


def start_decode_cached(workdir: Path, model_path: str, served: str, agg_served: str,
                        engine_args: tuple[str, ...], style: str, engine: str = "cpu") -> Stack:
    """The stack of `style` (who orchestrates the prefill), ready: every decode registered, one
    request through each model."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    stack = Stack(workdir, model_path)
    with stopped_on_failure(stack, "the decode-cache stack"):
        stack.start_frontend("--router-mode", "kv")
        prefill_events = ("--kv-events-config", kv_events_config()) if style == "frontend" else ()
        # SGLang counts the KV its prefill sends in its own metrics (sglang:kv_transfer_total_mb).
        metrics = ("--enable-metrics",) if engine == "sglang" else ()
        stack.start_worker(PREFILL, "prefill", served, *engine_args, *_disagg(style),
                           *prefill_events, *metrics,
                           "--disaggregation-bootstrap-port", str(free_port()), engine=engine)
        for name in decodes_of(style):
            start_decode(stack, name, served, engine_args, style, engine)
        stack.start_worker(AGG_WORKER, "null", agg_served, *engine_args, "--endpoint",
                           f"dyn://{stack.namespace or 'dynamo'}.agg.generate", engine=engine)
        wait_registered(stack, (PREFILL, *decodes_of(style), AGG_WORKER), style)
        stack.wait_ready(served, agg_served, probe=True)
    return stack


def _disagg(style: str) -> tuple[str, ...]:
    return ("--disaggregation-transfer-backend", "nixl", "--disagg-orchestrator", style)


def start_decode(stack: Stack, name: str, served: str, engine_args: tuple[str, ...], style: str,
                 engine: str = "cpu") -> None:
    """A decode worker with a prefix cache publishing its KV events (a replacement too)."""
    stack.start_worker(name, "decode", served, *engine_args, *_disagg(style), *DECODE_CACHE,
                       "--kv-events-config", kv_events_config(), engine=engine)


def wait_registered(stack: Stack, names: tuple[str, ...], style: str) -> None:
    """The workers `names` built their engines, and every decode worker of `style` registered."""
    wait_until(lambda: alive_then(stack, lambda: all(
        stack.procs[n].engine_route("prefix_cache") for n in names)), READY_TIMEOUT_S,
        f"/engine/prefix_cache of {names} on {stack.url}", interval=0.5)
    wait_until(lambda: alive_then(stack, lambda: _generate_instances(stack, "backend")
                                   >= len(decodes_of(style))), READY_TIMEOUT_S,
               "every decode worker registered", interval=0.5)


def _generate_instances(stack: Stack, component: str) -> int:
    """Instances of `component`'s generate endpoint in the file discovery directory."""
    root = stack.kv_dir / "v1" / "instances"
    prefix = f"{stack.namespace or 'dynamo'}/{component}/generate/"
    return sum(unquote(p.name).startswith(prefix) for p in root.iterdir()) if root.exists() else 0


def kv_bytes(stack: Stack, engine: str, prefill: str = PREFILL) -> float:
    """KV bytes the prefill worker `prefill` has written to decodes so far: the CPU engine's
    counter, or SGLang's `sglang:kv_transfer_total_mb` (with `--enable-metrics`; a histogram of
    MB per request, summed), which SGLang's connector counts from the KV pages it sends."""
    samples = scrape(stack.procs[prefill].system_port)
    if engine == "cpu":
        return samples.get((f"{PREFIX}kv_transfer_bytes_total", ""), 0.0)
    return samples.get(("sglang:kv_transfer_total_mb_sum", ""), 0.0) * 2**20


def decode_hits(stack: Stack) -> dict[str, int]:
    """Per decode worker: prompt tokens it has served from its own cache so far."""
    return {name: int(stack.procs[name].engine_route("prefix_cache")["hit_tokens"])
            for name in DECODES if name in stack.procs}
