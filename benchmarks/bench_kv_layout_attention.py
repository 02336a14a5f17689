"""What a KV pool layout costs attention: one decode step's slotpool attention (the engine's
``slotpool_attention_forward``: K/V written into the pool, then each row attends to its pool
rows) over every layer of the `small` model's geometry (8 layers, 8 heads, 4 KV heads, head_dim
64, fp32), per KVPool layout, the layouts interleaved round by round, 1 torch thread.

``head`` (the engine's) keeps a request's rows of one head contiguous; ``token`` makes a request's
whole KV one NIXL descriptor (benchmarks/bench_kv_transfer.py) but its rows strided.

    python -m benchmarks.bench_kv_layout_attention [--runs 9] [--layouts head token]
        [--out results/]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch

from benchmarks.common import format_table, limit_cpu_threads, median, results_dir, write_json
from components.engine.kv.pool import LAYOUTS, KVPool
from components.engine.model.attention import Segment, StepMeta, slotpool_attention_forward

LAYERS, HEADS, KV_HEADS, HEAD_DIM, PAGE = 8, 8, 4, 64, 16
CASES = ((1, 2000), (16, 128), (16, 1024))  # (decode batch, context tokens)


def decode_step(layout: str, batch: int, context: int):
    """A callable running one decode step's attention over all layers for ``batch`` rows."""
    pages = batch * (-(-(context + 1) // PAGE))
    pool = KVPool(LAYERS, KV_HEADS, HEAD_DIM, pages, PAGE, torch.float32, layout)
    # The same logical K/V in every layout (normal_ on the view would fill in storage order).
    pool.tensor.copy_(torch.randn(pool.tensor.shape, generator=torch.Generator().manual_seed(0)))
    starts = [pool.allocate(context + 1).start_page * PAGE for _ in range(batch)]
    meta = StepMeta.build(pool, [Segment(s, context, 1) for s in starts])
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, HEADS, batch, HEAD_DIM, generator=gen)
    kv = torch.randn(1, KV_HEADS, batch, HEAD_DIM, generator=gen)
    modules = [SimpleNamespace(layer_idx=i, num_key_value_groups=HEADS // KV_HEADS)
               for i in range(LAYERS)]

    def step() -> torch.Tensor:
        out = None
        for m in modules:
            out, _ = slotpool_attention_forward(m, q, kv, kv, None, kv_meta=meta)
        return out

    return step


def run(runs: int, layouts: list[str]) -> list[dict]:
    limit_cpu_threads(1)
    rows = []
    for batch, context in CASES:
        steps = {layout: decode_step(layout, batch, context) for layout in layouts}
        outs = {layout: step() for layout, step in steps.items()}  # warm-up, and same answers
        first = outs[layouts[0]]
        for layout, out in outs.items():
            if not torch.allclose(out, first, atol=1e-5):
                raise RuntimeError(f"{layout}-major attention differs from {layouts[0]}-major")
        times: dict[str, list[float]] = {layout: [] for layout in layouts}
        for _ in range(runs):
            for layout, step in steps.items():
                t0 = time.perf_counter()
                step()
                times[layout].append(time.perf_counter() - t0)
        base = median(times[layouts[0]])
        for layout in layouts:
            rows.append({"batch": batch, "context": context, "layout": layout,
                         "ms": median(times[layout]) * 1e3,
                         f"vs_{layouts[0]}": median(times[layout]) / base})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=["head", "token"])
    parser.add_argument("--out", default=None, help="results directory (default results/)")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3 (the table reports medians)")
    rows = run(args.runs, args.layouts)
    ref = f"vs_{args.layouts[0]}"
    print(format_table(["decode batch", "context", "layout", "attention ms / step",
                        f"/ {args.layouts[0]}-major"],
                       [[r["batch"], r["context"], r["layout"], r["ms"], r[ref]] for r in rows]))
    print(f"median of {args.runs} interleaved rounds; 1 torch thread")
    path = write_json(results_dir(args.out), "bench_kv_layout_attention",
                      {"runs": args.runs, "layouts": args.layouts, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
