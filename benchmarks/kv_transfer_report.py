"""The headline lines of `bench_kv_transfer` results on the benchmarks page: per KV pool layout,
NIXL / copy_ and the kernel-copy bounds (``benchmarks/summary.py``)."""

from __future__ import annotations

from benchmarks.common import fmt


def kv_transfer_lines(data: dict) -> list[str]:
    """Per arm, pool layout and UCX cma segment (older results have one, unnamed): NIXL / copy_
    and the kernel bounds."""
    first = data["first_transfer_ms"]
    first = first if isinstance(first, dict) else {"head:512k": first}
    lines = []
    for arm, first_ms in first.items():
        rows = [r for r in data["rows"] if r.get("arm", "head:512k") == arm]
        layout, seg = arm.split(":")
        ratios = [r["nixl_vs_copy"] for r in rows]
        big = [r for r in rows if r["mib"] >= 8 and "kernel_gbs" in r]
        runs = rows[0].get("descriptors", 64) if rows else 64
        lines.append(
            f"{layout}-major pool ({runs} descriptor(s) per request), UCX cma segment {seg}: "
            "NIXL bandwidth / "
            f"same-process copy bandwidth **{fmt(min(ratios))}x to {fmt(max(ratios))}x**; "
            f"first transfer (UCX wire-up) {fmt(first_ms)} ms")
        if not big:
            continue
        paired = ("; paired per round " + ", ".join(fmt(r["nixl_vs_copy_paired"]) for r in big)
                  if "nixl_vs_copy_paired" in big[0] else "")
        lines.append(
            f"{arm}, from 8 MiB: NIXL / copy_ "
            + ", ".join(fmt(r["nixl_vs_copy"]) for r in big) + paired
            + "; the kernel's cross-process copy (`process_vm_writev`, what UCX `cma` runs) "
            "/ copy_ " + ", ".join(fmt(r["kernel_vs_copy"]) for r in big)
            + ", made one call per descriptor as `cma` makes it "
            + ", ".join(fmt(r.get("kernel_runs_vs_copy")) for r in big)
            + "; NIXL / that bound " + ", ".join(fmt(r.get("nixl_vs_kernel_runs")) for r in big)
            + f" (UCX error handling {data.get('ucx_error_handling', 'peer')})")
    return lines
