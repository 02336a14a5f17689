"""A worker process's own Prometheus page (`/metrics` on its system port,
components/worker/metrics/worker_metrics.py), and the attached processes of `--tokenizer-worker-num
N`, each serving its own system port."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from components.worker.lifecycle.tokenizer_workers import ENGINE_PID_ENV
from harness.topology import HOST

PREFIX = "dynamo_component_engine_"
Samples = dict[tuple[str, str], float]


def scrape(port: int, host: str = HOST) -> Samples:
    """{(sample name, `le` or `outcome` label or ""): value}, summed over the other labels."""
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
    out: Samples = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, s.labels.get("le", s.labels.get("outcome", "")))] += s.value
    return out


def series(port: int, name: str, host: str = HOST) -> list[dict]:
    """Each sample named `name` on the page: its labels, with its value under "value"."""
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
    return [{**s.labels, "value": s.value} for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def attached_pids(pid: int) -> list[int]:
    """The attached workers among `pid`'s children (SGLang also spawns its scheduler and
    detokenizer, and renames processes): those started with the engine's pid in their env."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    return [c for c in children
            if ENGINE_PID_ENV.encode() in open(f"/proc/{c}/environ", "rb").read()]


def system_port_of(pid: int) -> int:
    """Each attached process serves its own system port (a free one the engine process picked)."""
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return int(next(v for v in env if v.startswith(b"DYN_SYSTEM_PORT=")).split(b"=", 1)[1])


def loop_lag_bound_s(before: Samples, after: Samples) -> float:
    """An upper bound on the largest event-loop lag between two scrapes: the smallest histogram
    bucket that holds every wake-up since `before` (inf if one fell past the largest)."""
    name = PREFIX + "event_loop_lag_seconds"
    total = after[(name + "_count", "")] - before[(name + "_count", "")]
    buckets = {float(le): after[(n, le)] - before.get((n, le), 0.0)
               for (n, le) in list(after) if n == name + "_bucket"}
    return next((le for le in sorted(buckets) if buckets[le] >= total), float("inf"))
