"""KVPool layouts (head-, token-, layer-major storage): a room's runs cover exactly its KV in
storage order, a WRITE between two token-major pools is one descriptor and lands exactly, and
peers whose layouts differ are refused instead of scrambling the KV."""

from __future__ import annotations

import ctypes
import time

import pytest
import torch

from components.engine.disagg.transport import (
    KVArrived,
    KVTransport,
    Peering,
    RoomReleased,
    TransferDone,
    TransferFailed,
)
from components.engine.kv.pool import LAYOUTS, KVPool
from protocol.kv_side_channel import KVLayout

HOST = "127.0.0.1"
LAYERS, HEADS, DIM, PAGES, PAGE = 3, 2, 4, 4096, 4
BIG = 12000  # tokens: 2.2 MiB of KV, several of UCX's default 512 KiB cma segments


def pool_of(layout: str) -> KVPool:
    return KVPool(LAYERS, HEADS, DIM, PAGES, PAGE, torch.float32, layout)


@pytest.mark.parametrize("layout,count", [("head", LAYERS * 2 * HEADS), ("layer", LAYERS),
                                          ("token", 1)])
def test_runs_are_the_rooms_bytes_in_storage_order(layout, count):
    pool = pool_of(layout)
    pool.tensor.copy_(torch.arange(pool.tensor.numel(), dtype=torch.float32)
                      .view(pool.tensor.shape))
    pool.allocate(5)  # the room does not start at page 0
    run = pool.allocate(7)
    runs = pool.token_runs(run, 7)
    assert len(runs) == count
    got = torch.frombuffer(bytearray(b"".join(ctypes.string_at(a, n) for a, n in runs)),
                           dtype=torch.float32)
    start = run.start_page * PAGE
    region = pool.tensor[:, :, :, start:start + 7]
    # The logical region, permuted into storage order, read row-major: the bytes of the runs.
    order = LAYOUTS[layout]
    assert torch.equal(got, region.permute(*order).contiguous().flatten())
    assert pool.k_view(2, start, 7).data_ptr() == pool.tensor[2, 0, 0, start].data_ptr()
    assert pool.storage.is_contiguous() and pool.data_ptr == pool.storage.data_ptr()


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="unknown KV pool layout"):
        pool_of("page")


class Side:
    def __init__(self, role: str, layout: str, cma_seg_size: str | None = "1g") -> None:
        self.pool = pool_of(layout)
        kv_layout = KVLayout("float32", LAYERS, HEADS, DIM, PAGE, "m@000000000000", layout)
        self.t = KVTransport(self.pool.storage, role, HOST, None, 2.0, 5.0,
                             peering=Peering(kv_layout, ucx_cma_seg_size=cma_seg_size))
        self.events: list = []

    def room(self, tokens: int):
        run = self.pool.allocate(tokens)
        start = run.start_page * PAGE
        return run, self.pool.tensor[:, :, :, start:start + tokens]


def until(side: Side, other: Side, room: int, timeout: float = 10.0):
    """``side``'s next event of ``room`` other than TransferDone; both sides are polled (each
    answers the other's side-channel messages only while polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        other.events.extend(other.t.poll(0.0))
        side.events.extend(side.t.poll(0.005))
        for ev in list(side.events):
            if ev.room == room and not isinstance(ev, TransferDone):
                side.events.remove(ev)
                return ev
    raise TimeoutError(f"room {room}: no event: {side.events}")


@pytest.fixture
def pair():
    made: list[Side] = []
    yield lambda pre, dec, seg="1g": (made.append(Side("prefill", pre, seg)) or made[-1],
                                      made.append(Side("decode", dec, seg)) or made[-1])
    for s in made:
        s.t.close()


@pytest.mark.parametrize("seg", ["1g", None])  # the engine's cma segment, UCX's default
def test_token_major_write_is_one_descriptor_and_lands_exactly(pair, seg):
    pre, dec = pair("token", "token", seg)
    src_run, src = pre.room(BIG)
    src.copy_(torch.randn(src.shape, generator=torch.Generator().manual_seed(1)))
    gap = dec.pool.allocate(2 * PAGE)  # the room sits on other pages than the prefill's
    dst_run, dst = dec.room(BIG)
    assert len(pre.pool.token_runs(src_run, BIG)) == 1
    dec.t.add_decode(1, HOST, pre.t.bootstrap_port, dec.pool.token_runs(dst_run, BIG), "r1")
    pre.t.add_prefill(1, pre.pool.token_runs(src_run, BIG), 9, "r1")
    assert until(dec, pre, 1) == KVArrived(1, 9)
    assert torch.equal(src, dst)
    assert pre.t.transfer_totals.nbytes == BIG * LAYERS * 2 * HEADS * DIM * 4 > 4 * 2**19
    pre.pool.free(src_run)
    assert dst_run.start_page != src_run.start_page
    dec.pool.free(dst_run)
    dec.pool.free(gap)
    assert pre.pool.pages_in_use == 0 and dec.pool.pages_in_use == 0


def test_peers_of_different_layouts_are_refused(pair):
    pre, dec = pair("head", "token")
    src_run, _ = pre.room(8)
    dst_run, dst = dec.room(8)
    dec.t.add_decode(2, HOST, pre.t.bootstrap_port, dec.pool.token_runs(dst_run, 8), "r2")
    pre.t.add_prefill(2, pre.pool.token_runs(src_run, 8), 9, "r2")
    ev = until(dec, pre, 2)
    assert isinstance(ev, TransferFailed) and "KV layout mismatch" in ev.message, ev
    assert "head-major" in ev.message and "token-major" in ev.message
    assert until(dec, pre, 2) == RoomReleased(2)
    assert not dst.any()  # nothing was written
    dec.pool.free(dst_run)
    ev = until(pre, dec, 2, timeout=5.0)  # nobody registers the prefill's room: it times out
    assert isinstance(ev, TransferFailed)
    pre.pool.free(src_run)
    assert pre.pool.pages_in_use == 0 and dec.pool.pages_in_use == 0
