"""KV transfer bandwidth: the engine's NIXL WRITE between two processes vs an in-process copy_.

Sizes are the KV of 128..4096-token prompts of the `small` model (8 layers, 4 KV heads, head_dim
64, fp32: 16 KiB per token). ``--arms`` pairs a KVPool layout with UCX's cma segment size, each
with its own pools, transport and decode peer, measured interleaved: by default head-major (the
engine's, 64 runs per room) with UCX's 512 KiB segments (before) and with the engine's 1 GiB
(one kernel call per descriptor), and token-major (a room is one descriptor). Per size and arm:
  nixl  - the whole KVTransport path: the decode peer process has registered the room; the clock
          runs from ``add_prefill`` (descriptors, WRITE post) to ``TransferDone`` (the prefill
          polls without sleeping, so no poll slice is counted);
  copy  - ``dst.copy_(src)`` of the same runs between two pools in this process, 1 torch thread
          (the baseline: a single-threaded memcpy of the same bytes);
  kernel - the same runs copied by ``process_vm_writev`` (benchmarks/kernel_copy.py), the kernel
          call UCX's ``cma`` transport makes for a same-host WRITE, all runs in one call;
  kernel per run - one call per run, as ``cma`` makes them (one per NIXL descriptor): the bound
          of a NIXL WRITE of this layout here.
"paired" is the median over rounds of NIXL / copy_ of the same round (the arms run back to back),
steadier than the ratio of medians on a shared machine. The first transfer (UCX wire-up) is
reported apart. Every size's data is verified on the decode
side. Median of --runs (>= 3). ``--ucx-error-handling`` sets both sides' UCX mode (the engine's
``--cpu-kv-ucx-error-handling``; "peer" is NIXL's default, for comparison).

    python -m benchmarks.bench_kv_transfer [--runs 5] [--ucx-error-handling none]
        [--arms head:512k head:1g token:1g] [--out results/]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import (format_table, limit_cpu_threads, median, new_figure, ratio,
                               results_dir, save_figure, write_json)
from benchmarks.kernel_copy import kernel_copy_s
from benchmarks.kv_peer import (HEAD_DIM, HOST, KV_HEADS, LAYERS, TIMEOUT_S, DecodePeer,
                                 make_pool, region)
from components.engine.kv.pool import DEFAULT_LAYOUT, LAYOUTS, KVPool
from components.engine.config import UCX_ERROR_HANDLING
from components.engine.disagg.transport.nixl_endpoint import CMA_SEG_SIZE
from components.engine.disagg.transport import (
    KVTransport,
    Peering,
    PrefillTransport,
    TransferDone,
    TransferFailed,
)

SIZES = (128, 256, 512, 1024, 2048, 4096)
# Before (UCX's 512 KiB cma segments), the engine's now, and a one-descriptor-per-room pool.
DEFAULT_ARMS = (f"{DEFAULT_LAYOUT}:512k", f"{DEFAULT_LAYOUT}:{CMA_SEG_SIZE}",
                f"token:{CMA_SEG_SIZE}")


def nixl_once(transport: PrefillTransport, pool: KVPool, peer: DecodePeer, room: int,
              tokens: int) -> float:
    """Seconds from add_prefill to TransferDone for one room (decode registered beforehand)."""
    run = pool.allocate(tokens)
    src = region(pool, run, tokens)
    src.copy_(torch.randn(src.shape, generator=torch.Generator().manual_seed(room)))
    expected = float(src.double().sum())
    peer.call(op="register", room=room, tokens=tokens, port=transport.bootstrap_port)
    settle = time.monotonic() + 0.02  # let the registration land before the clock starts
    while time.monotonic() < settle:
        transport.poll(0.002)
    t0 = time.perf_counter()
    transport.add_prefill(room, pool.token_runs(run, tokens), 1, "bench")
    done = None
    while done is None:
        for ev in transport.poll(0.0):
            if isinstance(ev, TransferFailed):
                raise RuntimeError(ev.message)
            done = ev if isinstance(ev, TransferDone) else done
        if time.perf_counter() - t0 > TIMEOUT_S:
            raise TimeoutError(f"room {room}: no TransferDone")
    elapsed = time.perf_counter() - t0
    pool.free(run)
    got = peer.call(op="report", room=room)  # asked only now: nothing arrives while timing
    if got["sum"] != expected:
        raise RuntimeError(f"room {room}: decode checksum {got['sum']} != {expected}")
    return elapsed


def copy_once(src_pool: KVPool, dst_pool: KVPool, tokens: int, kernel: str = "") -> float:
    """``kernel``: "" (torch copy_), "one" (one process_vm_writev) or "runs" (one per run)."""
    a, b = src_pool.allocate(tokens), dst_pool.allocate(tokens)
    src, dst = region(src_pool, a, tokens), region(dst_pool, b, tokens)
    src.normal_()
    if kernel:
        elapsed = kernel_copy_s(src_pool.token_runs(a, tokens), dst_pool.token_runs(b, tokens),
                                per_run=kernel == "runs")
    else:
        t0 = time.perf_counter()
        dst.copy_(src)
        elapsed = time.perf_counter() - t0
    assert torch.equal(src, dst)
    src_pool.free(a)
    dst_pool.free(b)
    return elapsed


def _round(tokens: int, room: int, transport: PrefillTransport, pool: KVPool,
          other: KVPool, peer: DecodePeer) -> dict[str, float]:
    """One round of the four arms for one layout: {arm: seconds}."""
    return {"nixl": nixl_once(transport, pool, peer, room, tokens),
            "copy": copy_once(pool, other, tokens),
            "kernel": copy_once(pool, other, tokens, kernel="one"),
            "runs": copy_once(pool, other, tokens, kernel="runs")}


def _row(arm: str, tokens: int, descriptors: int, times: dict[str, list[float]]) -> dict:
    nbytes = tokens * LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
    gbs = {what: nbytes / median(ts) / 1e9 for what, ts in times.items()}
    layout, seg = arm.split(":")
    return {"arm": arm, "layout": layout, "cma_seg_size": seg, "tokens": tokens,
            "mib": nbytes / 2**20,
            "descriptors": descriptors,
            "nixl_ms": median(times["nixl"]) * 1e3, "nixl_gbs": gbs["nixl"],
            "copy_ms": median(times["copy"]) * 1e3, "copy_gbs": gbs["copy"],
            "nixl_vs_copy": ratio(gbs["nixl"], gbs["copy"]),
            # Per round (the arms run back to back): robust to a shared machine's load swings.
            "nixl_vs_copy_paired": median(c / n for n, c in zip(times["nixl"], times["copy"])),
            "kernel_gbs": gbs["kernel"],
            "kernel_vs_copy": ratio(gbs["kernel"], gbs["copy"]),
            "nixl_vs_kernel": ratio(gbs["nixl"], gbs["kernel"]),
            "kernel_runs_ms": median(times["runs"]) * 1e3, "kernel_runs_gbs": gbs["runs"],
            "kernel_runs_vs_copy": ratio(gbs["runs"], gbs["copy"]),
            "nixl_vs_kernel_runs": ratio(gbs["nixl"], gbs["runs"])}


def run(runs: int, out_dir, ucx_error_handling: str = "none",
        arms: tuple[str, ...] = DEFAULT_ARMS) -> dict:
    """Every arm (``layout:cma_seg_size``) gets its own pools, transport and decode peer; their
    rounds interleave, so the arms' ratios come from the same minutes of a shared machine."""
    limit_cpu_threads(1)
    max_tokens = max(SIZES)
    sides, rows, room, first_ms = {}, [], 1, {}
    try:
        for arm in arms:
            layout, seg = arm.split(":")
            pool, other = make_pool(max_tokens, layout), make_pool(max_tokens, layout)
            peering = Peering(ucx_error_handling=ucx_error_handling, ucx_cma_seg_size=seg)
            transport = KVTransport(pool.storage, "prefill", HOST, None, TIMEOUT_S, TIMEOUT_S,
                                    peering=peering)
            sides[arm] = (transport, pool, other, None)  # closed even if the peer fails
            peer = DecodePeer(max_tokens, ucx_error_handling, layout)
            sides[arm] = (transport, pool, other, peer)
            room += 1
            first_ms[arm] = nixl_once(transport, pool, peer, room, 16) * 1e3  # UCX wire-up
        for tokens in SIZES:
            times = {arm: {"nixl": [], "copy": [], "kernel": [], "runs": []} for arm in arms}
            for _ in range(runs):
                for arm in arms:
                    room += 1
                    for what, t in _round(tokens, room, *sides[arm]).items():
                        times[arm][what].append(t)
            for arm in arms:
                pool = sides[arm][1]
                probe = pool.allocate(tokens)
                descriptors = len(pool.token_runs(probe, tokens))
                pool.free(probe)
                rows.append(_row(arm, tokens, descriptors, times[arm]))
    finally:
        for transport, _, _, peer in sides.values():
            transport.close()
            if peer is not None:
                peer.close()
    return {"first_transfer_ms": first_ms, "runs": runs, "ucx_error_handling": ucx_error_handling,
            "arms": list(arms), "rows": rows}


def report(result: dict, out_dir) -> None:
    headers = ["arm", "prompt tokens", "KV MiB", "descriptors", "NIXL ms", "NIXL GB/s",
               "copy_ ms", "copy_ GB/s", "NIXL/copy_", "paired", "kernel GB/s", "kernel/copy_",
               "NIXL/kernel", "kernel/run ms", "kernel/run / copy_", "NIXL / kernel/run"]
    table = [[r["arm"], r["tokens"], r["mib"], r["descriptors"], r["nixl_ms"], r["nixl_gbs"],
              r["copy_ms"], r["copy_gbs"], r["nixl_vs_copy"], r["nixl_vs_copy_paired"],
              r["kernel_gbs"],
              r["kernel_vs_copy"], r["nixl_vs_kernel"], r["kernel_runs_ms"],
              r["kernel_runs_vs_copy"], r["nixl_vs_kernel_runs"]]
             for r in result["rows"]]
    print(format_table(headers, table))
    first = ", ".join(f"{k} {v:.2f} ms" for k, v in result["first_transfer_ms"].items())
    print(f"first transfer (UCX wire-up, 16 tokens): {first}; median of {result['runs']} runs; "
          f"UCX error handling {result['ucx_error_handling']}")
    path = write_json(out_dir, "bench_kv_transfer", result)
    fig, (ax,) = new_figure()
    for arm in result["arms"]:
        rows = [r for r in result["rows"] if r["arm"] == arm]
        tokens = [r["tokens"] for r in rows]
        ax.plot(tokens, [r["nixl_gbs"] for r in rows], "o-", label=f"NIXL WRITE, {arm}")
    rows = [r for r in result["rows"] if r["arm"] == result["arms"][0]]
    ax.plot([r["tokens"] for r in rows], [r["copy_gbs"] for r in rows], "s--",
            label=f"torch copy_ (1 thread), {result['arms'][0]}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens (small model, 16 KiB/token)")
    ax.set_ylabel("GB/s")
    ax.set_title("KV transfer bandwidth")
    ax.legend()
    png = save_figure(fig, out_dir, "bench_kv_transfer")
    print(f"wrote {path} and {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None, help="results directory (default results/)")
    parser.add_argument("--ucx-error-handling", choices=UCX_ERROR_HANDLING, default="none",
                        help="both sides' NIXL UCX error handling (the engine's default: none)")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS),
                        help="LAYOUT:CMA_SEG_SIZE pairs measured interleaved: a KVPool layout "
                             f"({', '.join(LAYOUTS)}) and UCX's cma segment (512k is UCX's "
                             f"default; the engine's: {DEFAULT_LAYOUT}:{CMA_SEG_SIZE})")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3 (the table reports medians)")
    out_dir = results_dir(args.out)
    for arm in args.arms:
        if arm.count(":") != 1 or arm.split(":")[0] not in LAYOUTS:
            parser.error(f"--arms: {arm!r} is not LAYOUT:CMA_SEG_SIZE")
    report(run(args.runs, out_dir, args.ucx_error_handling, tuple(args.arms)), out_dir)


if __name__ == "__main__":
    main()
