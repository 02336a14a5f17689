"""Pairing the source and destination byte runs of one room's KV.

Both sides list a room's KV as ``(addr, nbytes)`` runs in the same logical order (KVPool's
``token_runs``: layer, then K/V, then head). The transport reads each list as one ordered byte
stream, so the two lists need only the same total size: the runs are split at the union of both
sides' boundaries. With the engine's one-run-per-plane layout the split is the identity.
"""

from __future__ import annotations

Run = tuple[int, int]


def total_bytes(runs: list[Run]) -> int:
    return sum(n for _, n in runs)


def pair_runs(src: list[Run], dst: list[Run]) -> tuple[list[Run], list[Run]]:
    """Equal-length piecewise split of ``src`` and ``dst``; ValueError if the totals differ."""
    src_total, dst_total = total_bytes(src), total_bytes(dst)
    if src_total != dst_total:
        raise ValueError(
            f"KV layout mismatch: prefill has {len(src)} runs / {src_total} bytes, "
            f"decode registered {len(dst)} runs / {dst_total} bytes "
            "(model, dtype or token count differ between the two engines?)"
        )
    if len(src) == len(dst) and all(a[1] == b[1] for a, b in zip(src, dst)):
        return list(src), list(dst)
    out_src: list[Run] = []
    out_dst: list[Run] = []
    i = j = 0
    src_off = dst_off = 0  # bytes already consumed of src[i] / dst[j]
    while i < len(src) and j < len(dst):
        step = min(src[i][1] - src_off, dst[j][1] - dst_off)
        out_src.append((src[i][0] + src_off, step))
        out_dst.append((dst[j][0] + dst_off, step))
        src_off += step
        dst_off += step
        if src_off == src[i][1]:
            i, src_off = i + 1, 0
        if dst_off == dst[j][1]:
            j, dst_off = j + 1, 0
    return out_src, out_dst


def skip_tokens(src: list[Run], tokens: int, dst: list[Run], skip: int) -> list[Run]:
    """The prefill's runs of a room (``tokens`` tokens, one run per plane) without the first
    ``skip`` tokens, which the decode already holds; ValueError unless each of the decode's runs
    is the same plane's run, ``skip`` tokens shorter."""
    if skip == 0:
        return src
    if not 0 < skip < tokens or len(src) != len(dst):
        raise ValueError(f"KV layout mismatch: the decode holds {skip} of the prompt's "
                         f"{tokens or 'unknown'} tokens and registered {len(dst)} runs for the "
                         f"prefill's {len(src)}")
    out: list[Run] = []
    for (addr, n), (_, m) in zip(src, dst):
        cut = n // tokens * skip
        if n % tokens or m != n - cut:
            raise ValueError(f"KV layout mismatch: the decode holds {skip} of the prompt's "
                             f"{tokens} tokens but registered {m} of a run's {n} bytes")
        out.append((addr + cut, m))
    return out


def coalesce(src: list[Run], dst: list[Run]) -> tuple[list[Run], list[Run]]:
    """Join consecutive pairs that continue each other on both sides: fewer, longer descriptors
    per WRITE (a room that spans whole pool planes becomes one run)."""
    out_src: list[Run] = []
    out_dst: list[Run] = []
    for (s_addr, n), (d_addr, _) in zip(src, dst):
        if out_src and out_src[-1][0] + out_src[-1][1] == s_addr \
                and out_dst[-1][0] + out_dst[-1][1] == d_addr:
            out_src[-1] = (out_src[-1][0], out_src[-1][1] + n)
            out_dst[-1] = (out_dst[-1][0], out_dst[-1][1] + n)
        else:
            out_src.append((s_addr, n))
            out_dst.append((d_addr, n))
    return out_src, out_dst


def check_within(runs: list[Run], base: int, nbytes: int, what: str) -> None:
    """ValueError unless every run is non-empty and inside ``[base, base + nbytes)``."""
    if not runs:
        raise ValueError(f"{what}: no KV runs given")
    end = base + nbytes
    for addr, n in runs:
        if n <= 0 or addr < base or addr + n > end:
            raise ValueError(
                f"{what}: run (addr=0x{addr:x}, nbytes={n}) is outside the registered KV pool "
                f"[0x{base:x}, 0x{end:x})"
            )
