"""KV transfer bandwidth: the engine's NIXL WRITE between two processes vs an in-process copy_.

Sizes are the KV of 128..4096-token prompts of the `small` model (8 layers, 4 KV heads, head_dim
64, fp32: 16 KiB per token), laid out as the engine lays them out (KVPool, 64 runs per room).
Arms, per size:
  nixl  - the whole KVTransport path: the decode peer process has registered the room; the clock
          runs from ``add_prefill`` (descriptors, WRITE post) to ``TransferDone`` (the prefill
          polls without sleeping, so no poll slice is counted);
  copy  - ``dst.copy_(src)`` of the same runs between two pools in this process, 1 torch thread
          (the baseline: a single-threaded memcpy of the same bytes);
  kernel - the same runs copied by ``process_vm_writev`` (benchmarks/kernel_copy.py), the kernel
          call UCX's ``cma`` transport makes for a same-host WRITE, all runs in one call;
  kernel per run - one call per run, as ``cma`` makes them (one per NIXL descriptor): the bound
          of a NIXL WRITE of this layout here.
The first transfer (UCX wire-up) is reported apart. Every size's data is verified on the decode
side. Median of --runs (>= 3). ``--ucx-error-handling`` sets both sides' UCX mode (the engine's
``--cpu-kv-ucx-error-handling``; "peer" is NIXL's default, for comparison).

    python -m benchmarks.bench_kv_transfer [--runs 5] [--ucx-error-handling none] [--out results/]
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
from components.engine.kv.pool import KVPool
from components.engine.config import UCX_ERROR_HANDLING
from components.engine.disagg.transport import (
    KVTransport,
    Peering,
    PrefillTransport,
    TransferDone,
    TransferFailed,
)

SIZES = (128, 256, 512, 1024, 2048, 4096)


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


def run(runs: int, out_dir, ucx_error_handling: str = "none") -> dict:
    limit_cpu_threads(1)
    max_tokens = max(SIZES)
    pool, other = make_pool(max_tokens), make_pool(max_tokens)
    transport = KVTransport(pool.tensor, "prefill", HOST, None, TIMEOUT_S, TIMEOUT_S,
                            peering=Peering(ucx_error_handling=ucx_error_handling))
    peer = DecodePeer(max_tokens, ucx_error_handling)
    rows, room = [], 1
    try:
        first_ms = nixl_once(transport, pool, peer, room, 16) * 1e3  # UCX wire-up
        for tokens in SIZES:
            nbytes = tokens * LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
            nixl_s, copy_s, kernel_s, runs_s = [], [], [], []
            for _ in range(runs):
                room += 1
                nixl_s.append(nixl_once(transport, pool, peer, room, tokens))
                copy_s.append(copy_once(pool, other, tokens))
                kernel_s.append(copy_once(pool, other, tokens, kernel="one"))
                runs_s.append(copy_once(pool, other, tokens, kernel="runs"))
            nixl_gbs, copy_gbs = nbytes / median(nixl_s) / 1e9, nbytes / median(copy_s) / 1e9
            kernel_gbs, runs_gbs = nbytes / median(kernel_s) / 1e9, nbytes / median(runs_s) / 1e9
            rows.append({"tokens": tokens, "mib": nbytes / 2**20,
                         "nixl_ms": median(nixl_s) * 1e3, "nixl_gbs": nixl_gbs,
                         "copy_ms": median(copy_s) * 1e3, "copy_gbs": copy_gbs,
                         "nixl_vs_copy": ratio(nixl_gbs, copy_gbs), "kernel_gbs": kernel_gbs,
                         "kernel_vs_copy": ratio(kernel_gbs, copy_gbs),
                         "nixl_vs_kernel": ratio(nixl_gbs, kernel_gbs),
                         "kernel_runs_ms": median(runs_s) * 1e3, "kernel_runs_gbs": runs_gbs,
                         "kernel_runs_vs_copy": ratio(runs_gbs, copy_gbs),
                         "nixl_vs_kernel_runs": ratio(nixl_gbs, runs_gbs)})
    finally:
        transport.close()
        peer.close()
    return {"first_transfer_ms": first_ms, "runs": runs, "ucx_error_handling": ucx_error_handling,
            "rows": rows}


def report(result: dict, out_dir) -> None:
    headers = ["prompt tokens", "KV MiB", "NIXL ms", "NIXL GB/s", "copy_ ms", "copy_ GB/s",
               "NIXL/copy_", "kernel GB/s", "kernel/copy_", "NIXL/kernel", "kernel/run ms",
               "kernel/run / copy_", "NIXL / kernel/run"]
    table = [[r["tokens"], r["mib"], r["nixl_ms"], r["nixl_gbs"], r["copy_ms"], r["copy_gbs"],
              r["nixl_vs_copy"], r["kernel_gbs"], r["kernel_vs_copy"], r["nixl_vs_kernel"],
              r["kernel_runs_ms"], r["kernel_runs_vs_copy"], r["nixl_vs_kernel_runs"]]
             for r in result["rows"]]
    print(format_table(headers, table))
    print(f"first transfer (UCX wire-up, 16 tokens): {result['first_transfer_ms']:.2f} ms; "
          f"median of {result['runs']} runs; UCX error handling {result['ucx_error_handling']}")
    path = write_json(out_dir, "bench_kv_transfer", result)
    fig, (ax,) = new_figure()
    tokens = [r["tokens"] for r in result["rows"]]
    ax.plot(tokens, [r["nixl_gbs"] for r in result["rows"]], "o-", label="NIXL WRITE (2 processes)")
    ax.plot(tokens, [r["copy_gbs"] for r in result["rows"]], "s--", label="torch copy_ (1 thread)")
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
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3 (the table reports medians)")
    out_dir = results_dir(args.out)
    report(run(args.runs, out_dir, args.ucx_error_handling), out_dir)


if __name__ == "__main__":
    main()
