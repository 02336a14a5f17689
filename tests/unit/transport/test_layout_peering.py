"""Finding 7 of issue 9 (a KV layout mismatch refuses the peer, on both sides) and the side
channel's shared secret, over real ZMQ and NIXL in one process."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch

from components.engine.config import EngineConfig
from components.engine.kv.pool import KVPool
from components.engine.disagg.transport import (
    KVArrived,
    KVTransport,
    Peering,
    RoomReleased,
    TransferDone,
    TransferFailed,
    engine_peering,
)
from components.engine.disagg.transport.auth import sign_hello
from components.engine.disagg.transport.peering import model_id
from protocol.kv_side_channel import KVLayout, Refused, Welcome
from tests.support.kv_rogue import HOST, Rogue, RogueAgent

SHAPE = (2, 2, 16, 32, 16)  # layers, kv_heads, head_dim, pages, page_size
SECRET = b"s3cret-shared-by-all-engines"


def layout(dtype="bfloat16", model="tiny@0123456789ab") -> KVLayout:
    return KVLayout(dtype=dtype, num_layers=2, num_kv_heads=2, head_dim=16, page_size=16,
                    model_id=model)


class Side:
    def __init__(self, role: str, dtype: torch.dtype, peering: Peering, bootstrap_timeout=5.0):
        self.pool = KVPool(*SHAPE, dtype)
        self.t = KVTransport(self.pool.storage, role, HOST, None, bootstrap_timeout, 5.0,
                             peering=peering)
        self.events: list = []

    def runs(self, tokens: int = 20):
        return self.pool.token_runs(self.pool.allocate(tokens), tokens)

    def close(self) -> None:
        self.t.close()


def until(sides, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in sides:
            s.events.extend(s.t.poll(0.005))
            for ev in list(s.events):
                if pred(ev):
                    s.events.remove(ev)
                    return ev
    raise TimeoutError(f"no matching event: {[s.events for s in sides]}")


@pytest.fixture
def sides():
    made: list[Side] = []
    yield lambda *a, **k: made.append(Side(*a, **k)) or made[-1]
    for s in made:
        s.close()


def transfer(pre: Side, dec: Side, room: int):
    dec.t.add_decode(room, HOST, pre.t.bootstrap_port, dec.runs(), f"r{room}")
    pre.t.add_prefill(room, pre.runs(), 3, f"r{room}")
    return until([pre, dec], lambda e: e.room == room and not isinstance(e, TransferDone))


def test_dtype_mismatch_refuses_the_decode_with_both_layouts_named(sides, caplog):
    pre = sides("prefill", torch.bfloat16, Peering(layout("bfloat16")), bootstrap_timeout=1.0)
    dec = sides("decode", torch.float16, Peering(layout("float16")))  # same bytes per token
    with caplog.at_level(logging.WARNING):
        ev = transfer(pre, dec, 5)
    assert isinstance(ev, TransferFailed) and "KV layout mismatch" in ev.message, ev
    assert "prefill has tiny@0123456789ab bfloat16" in ev.message
    assert "decode has tiny@0123456789ab float16" in ev.message
    assert until([dec], lambda e: e.room == 5) == RoomReleased(5)
    assert any("KV layout mismatch" in r.getMessage() for r in caplog.records
               if r.name.endswith("peers"))
    # Nothing was written: the prefill's room ends when nobody registers it.
    ev = until([pre], lambda e: e.room == 5, timeout=4.0)
    assert isinstance(ev, TransferFailed) and "timed out waiting for decode" in ev.message


def test_model_mismatch_of_the_same_shape_is_refused(sides):
    pre = sides("prefill", torch.float32, Peering(layout("float32", "tiny@aaaaaaaaaaaa")))
    dec = sides("decode", torch.float32, Peering(layout("float32", "other@bbbbbbbbbbbb")))
    ev = transfer(pre, dec, 6)
    assert isinstance(ev, TransferFailed) and "other@bbbbbbbbbbbb" in ev.message


def test_equal_layouts_and_secrets_transfer(sides):
    peering = Peering(layout("float32"), SECRET)
    pre = sides("prefill", torch.float32, peering)
    dec = sides("decode", torch.float32, peering)
    assert transfer(pre, dec, 7) == KVArrived(7, 3)


@pytest.mark.parametrize("decode_secret", [None, b"another-secret-of-some-length"])
def test_a_decode_without_the_secret_is_refused(sides, decode_secret):
    pre = sides("prefill", torch.float32, Peering(layout("float32"), SECRET))
    dec = sides("decode", torch.float32, Peering(layout("float32"), decode_secret))
    ev = transfer(pre, dec, 8)
    assert isinstance(ev, TransferFailed) and "authentication failed" in ev.message, ev


def test_a_signed_hello_cannot_be_replayed(sides):
    pre = sides("prefill", torch.float32, Peering(None, SECRET))
    agent = RogueAgent("captured-decode")
    first, second = Rogue(pre.t.bootstrap_port), Rogue(pre.t.bootstrap_port)
    try:
        hello = sign_hello(SECRET, agent.hello())
        first.send(hello)
        assert isinstance(first.wait_reply(lambda: pre.t.poll(0.005), lambda m: True), Welcome)
        first.close()
        second.send(hello)  # the same bytes, another connection: a replay
        reply = second.wait_reply(lambda: pre.t.poll(0.005), lambda m: True)
        assert isinstance(reply, Refused) and "replayed" in reply.reason
    finally:
        second.close()
        agent.close()


def test_model_id_ignores_volatile_config_keys(tmp_path):
    a, b, c = (tmp_path / n for n in ("m", "copy/m", "n"))
    for path, cfg in ((a, {"hidden_size": 64, "transformers_version": "4.1"}),
                      (b, {"transformers_version": "4.9", "hidden_size": 64}),
                      (c, {"hidden_size": 65})):
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(cfg))
    assert model_id(str(a)) == model_id(str(b)) and model_id(str(a)).startswith("m@")
    assert model_id(str(c)).split("@")[1] != model_id(str(a)).split("@")[1]


def test_engine_peering_from_config_and_pool(tmp_path):
    cfg = EngineConfig(model_path=str(tmp_path), kv_side_channel_secret="x" * 16)
    pool = KVPool(*SHAPE, torch.bfloat16)
    peering = engine_peering(cfg, pool)
    assert peering.layout == KVLayout("bfloat16", 2, 2, 16, 16, tmp_path.name)
    assert peering.secret == b"x" * 16
    assert "x" * 16 not in repr(cfg) and "x" * 16 not in repr(peering)
    with pytest.raises(ValueError, match="kv_side_channel_secret"):
        EngineConfig(model_path=str(tmp_path), kv_side_channel_secret="short")
