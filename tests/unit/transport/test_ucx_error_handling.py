"""NIXL's UCX error handling mode (``--cpu-kv-ucx-error-handling``): under "none", the engine's
default, a WRITE completes inside the posting call without the decode progressing UCX; the
prefill refuses a decode whose mode differs (UCX cannot connect such endpoints)."""

from __future__ import annotations

import time

import pytest
import torch

from components.worker.flags.config import parse_args
from components.backends.cpu_flags import UCX_ERROR_HANDLING_ENV
from components.engine.config import EngineConfig
from components.engine.kv.pool import KVPool
from components.engine.disagg.transport import (
    KVArrived, KVTransport, Peering, RoomReleased, TransferDone, TransferFailed,
)
from tests.support.kv_rogue import HOST

SHAPE = (2, 2, 16, 32, 16)  # layers, kv_heads, head_dim, pages, page_size
MODEL = ["--model-path", "/models/tiny"]


class Side:
    def __init__(self, role: str, mode: str) -> None:
        self.pool = KVPool(*SHAPE, torch.float32)
        self.t = KVTransport(self.pool.storage, role, HOST, None, 2.0, 5.0,
                             peering=Peering(ucx_error_handling=mode))
        self.events: list = []  # polled, not yet matched

    def runs(self, tokens: int = 20):
        return self.pool.token_runs(self.pool.allocate(tokens), tokens)


@pytest.fixture
def sides():
    made: list[Side] = []
    yield lambda *a: made.append(Side(*a)) or made[-1]
    for s in made:
        s.t.close()


def until(side: Side, pred, timeout: float = 10.0, also: Side | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if also is not None:
            also.t.poll(0.001)
        side.events.extend(side.t.poll(0.002))
        for ev in side.events:
            if pred(ev):
                side.events.remove(ev)
                return ev
    raise TimeoutError("no matching event")


def registered(pre: Side, dec: Side, room: int) -> None:
    dec.t.add_decode(room, HOST, pre.t.bootstrap_port, dec.runs(), f"r{room}")
    deadline = time.monotonic() + 10.0
    while pre.t.counters["registrations"] < 1:
        assert time.monotonic() < deadline, "the registration never reached the prefill"
        pre.t.poll(0.002)
        dec.t.poll(0.002)


def test_none_mode_write_is_done_without_the_decode_progressing(sides):
    pre, dec = sides("prefill", "none"), sides("decode", "none")
    registered(pre, dec, 7)
    data = pre.runs()
    pre.pool.tensor.fill_(1.5)
    pre.t.add_prefill(7, data, 3, "r7")  # the first WRITE to this peer: wire-up included
    # Only the prefill polls: DONE cannot wait for the decode's UCX progress.
    assert until(pre, lambda e: e.room == 7, timeout=5.0) == TransferDone(7)
    ev = until(dec, lambda e: e.room == 7)
    assert isinstance(ev, KVArrived) and ev.first_token == 3
    assert float(dec.pool.tensor[:, :, :, :20].mean()) == 1.5


def test_peer_mode_still_transfers(sides):
    pre, dec = sides("prefill", "peer"), sides("decode", "peer")
    registered(pre, dec, 8)
    pre.t.add_prefill(8, pre.runs(), 4, "r8")
    assert until(pre, lambda e: e.room == 8, also=dec) == TransferDone(8)
    assert until(dec, lambda e: e.room == 8) == KVArrived(8, 4, None)


def test_a_decode_of_the_other_mode_is_refused_naming_both(sides):
    pre, dec = sides("prefill", "none"), sides("decode", "peer")
    dec.t.add_decode(9, HOST, pre.t.bootstrap_port, dec.runs(), "r9")
    ev = until(dec, lambda e: e.room == 9, also=pre)
    assert isinstance(ev, TransferFailed), ev
    assert "UCX error handling mismatch" in ev.message
    assert "'none'" in ev.message and "'peer'" in ev.message
    assert until(dec, lambda e: e.room == 9) == RoomReleased(9)


def test_mode_flag_environment_and_validation(monkeypatch, tmp_path):
    monkeypatch.delenv(UCX_ERROR_HANDLING_ENV, raising=False)
    assert "kv_ucx_error_handling" not in dict(parse_args(MODEL).engine_args)
    assert EngineConfig(model_path=str(tmp_path)).kv_ucx_error_handling == "none"
    args = parse_args(MODEL + ["--cpu-kv-ucx-error-handling", "peer"])
    assert dict(args.engine_args)["kv_ucx_error_handling"] == "peer"
    monkeypatch.setenv(UCX_ERROR_HANDLING_ENV, "peer")
    kwargs = dict(parse_args(MODEL).engine_args)
    assert EngineConfig.from_kwargs(**kwargs).kv_ucx_error_handling == "peer"
    with pytest.raises(ValueError, match="kv_ucx_error_handling"):
        EngineConfig(model_path=str(tmp_path), kv_ucx_error_handling="sometimes")
