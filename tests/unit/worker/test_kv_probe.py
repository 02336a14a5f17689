"""The KV path probe on `--engine sglang` (components/worker/rooms/kv_probe.py) over a real
loopback room watch, with engines that finish, abort or hang a one-token request as SGLang's
do: a good path is probed once per prefill connection and both halves join one room; a broken
one is a 503 naming the prefill, what failed and the UCX settings, at once for the next
request, and probed again once it expires; hung halves are aborted at the bound; a prefill
whose watch cannot be reached is not probed; a dropped connection forgets the verdict. The
decode handler asks before its engine joins a room."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import msgspec
import pytest

from components.worker.rooms.claims import RoomClaims
from components.worker.rooms.kv_probe import KVPathProbe, engine_prober
from components.worker.rooms.watch import NO_PROBER, RoomWatchServer
from components.worker.rooms.wiring import kv_path_probe
from handlers import DecodeConfig, DecodeHandler
from handlers.core.errors import EngineUnavailable
from handlers.disagg.orchestration import Orchestration
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST, BootstrapInfo
from protocol.room_watch import HEADER, KVProbed, ProbeKV, decode, decode_to_decode, frame
from tests.support.handler_fakes import FakeContext, FakeEngine, chunk, collect

pytestmark = pytest.mark.timeout(10)

PREFILL = ("10.0.0.7", 8998)
BOOT = BootstrapInfo(bootstrap_host=PREFILL[0], bootstrap_port=PREFILL[1], bootstrap_room=77)
DONE = chunk([5], {"type": "length", "length": 1}, prompt=1, completion=1)
FAILED = chunk([], {"type": "abort", "status_code": 500,
                    "message": "KV transfer failed: connection refused"})


async def checked(probe: KVPathProbe, boot: BootstrapInfo) -> None:
    """What the decode handler does: wait for the probe when `check` gives one."""
    probing = probe.check(boot)
    if probing is not None:
        await probing


async def stack(prefill: FakeEngine, prober: bool = True, **probe_kwargs):
    server = RoomWatchServer("127.0.0.1")
    await server.start()
    if prober:
        server.prober = engine_prober(prefill, PREFILL, timeout_s=probe_kwargs.get("timeout_s",
                                                                                    5.0))

    async def lookup(host: str, port: int):
        return ("127.0.0.1", server.port)

    return server, RoomClaims(lookup)


async def test_a_good_path_is_probed_once_and_both_halves_join_one_room():
    prefill, decode = FakeEngine([DONE]), FakeEngine([DONE])
    server, claims = await stack(prefill)
    probe = KVPathProbe(decode, claims)
    await asyncio.gather(*(checked(probe, BOOT) for _ in range(3)))  # three requests, one probe
    await checked(probe, BOOT)
    assert len(decode.calls) == len(prefill.calls) == 1
    d, p = decode.calls[0], prefill.calls[0]
    assert d["bootstrap_room"] == p["bootstrap_room"] != BOOT.bootstrap_room
    assert (p["bootstrap_host"], p["bootstrap_port"]) == PREFILL
    assert d["input_ids"] == p["input_ids"] and d["sampling_params"]["max_new_tokens"] == 1
    await claims.close()
    await server.close()


async def test_a_broken_path_is_a_503_naming_the_prefill_and_ucx_then_at_once(monkeypatch,
                                                                              caplog):
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    prefill, decode = FakeEngine([FAILED]), FakeEngine(hold=True)
    server, claims = await stack(prefill, timeout_s=0.5)
    probe = KVPathProbe(decode, claims, timeout_s=0.5)
    with caplog.at_level(logging.WARNING), pytest.raises(EngineUnavailable) as first:
        await checked(probe, BOOT)
    for part in ("10.0.0.7:8998", "KV transfer failed", "did not finish within 0.5 s",
                 "UCX_NET_DEVICES=lo", "UCX_PROTO_INFO=y"):
        assert part in str(first.value)
    assert decode.aborts  # the hung decode half was aborted at the bound
    assert any("failed its check" in r.getMessage() for r in caplog.records)
    with pytest.raises(EngineUnavailable):
        await checked(probe, BOOT)
    assert len(decode.calls) == 1  # at once: no second probe
    await claims.close()
    await server.close()


async def test_a_broken_verdict_expires_and_the_prefill_is_probed_again():
    prefill, decode = FakeEngine([FAILED]), FakeEngine([DONE])
    server, claims = await stack(prefill)
    probe = KVPathProbe(decode, claims, retry_s=0.0)
    for _ in range(2):
        with pytest.raises(EngineUnavailable, match="the prefill's half: .*KV transfer failed"):
            await checked(probe, BOOT)
    assert len(decode.calls) == len(prefill.calls) == 2
    await claims.close()
    await server.close()


async def test_a_hung_prefill_half_is_aborted_at_its_bound_and_said():
    prefill, decode = FakeEngine(hold=True), FakeEngine([DONE])
    server, claims = await stack(prefill, timeout_s=0.3)
    probe = KVPathProbe(decode, claims, timeout_s=2.0)
    with pytest.raises(EngineUnavailable, match="the prefill's half: it did not finish within"):
        await checked(probe, BOOT)
    assert prefill.aborts == [prefill.calls[0]["rid"]]
    await claims.close()
    await server.close()


async def test_a_prefill_without_a_prober_answers_at_once_and_is_not_trusted():
    server, claims = await stack(FakeEngine(), prober=False)
    probe = KVPathProbe(FakeEngine([DONE]), claims)
    with pytest.raises(EngineUnavailable, match=NO_PROBER):
        await checked(probe, BOOT)
    await claims.close()
    await server.close()


async def test_a_prefill_whose_watch_is_unreachable_is_not_probed(caplog):
    async def nowhere(host: str, port: int):
        return None

    decode = FakeEngine([DONE])
    probe = KVPathProbe(decode, RoomClaims(nowhere))
    with caplog.at_level(logging.WARNING):
        await checked(probe, BOOT)
    assert not decode.calls and "not probed" in caplog.text


async def test_a_canary_with_the_fake_bootstrap_host_is_not_probed():
    decode = FakeEngine([DONE])
    probe = KVPathProbe(decode, RoomClaims(None))  # a lookup would fail the test
    await checked(probe, BOOT.model_copy(update={"bootstrap_host": FAKE_BOOTSTRAP_HOST}))
    assert not decode.calls


async def test_a_dropped_connection_forgets_the_verdict():
    prefill, decode = FakeEngine([DONE]), FakeEngine([DONE])
    server, claims = await stack(prefill)
    probe = KVPathProbe(decode, claims)
    await checked(probe, BOOT)
    await claims.close()  # as when the prefill restarts: its connection is gone
    await checked(probe, BOOT)
    assert len(decode.calls) == len(prefill.calls) == 2
    await claims.close()
    await server.close()


class Broken:
    def check(self, boot: BootstrapInfo) -> None:
        raise EngineUnavailable(f"the KV path from prefill {boot.bootstrap_host} failed")


async def test_the_decode_handler_asks_before_its_engine_joins_the_room():
    engine = FakeEngine([DONE])
    config = DecodeConfig(served_model_name="tiny", context_length=64, vocab_size=100,
                          orchestration=Orchestration.FRONTEND)
    handler = DecodeHandler(engine, config, kv_paths=Broken())
    request = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 2},
               "sampling_options": {"temperature": 0.0}, "eos_token_ids": [2],
               "bootstrap_info": BOOT.model_dump()}
    with pytest.raises(EngineUnavailable, match="10.0.0.7 failed"):
        await collect(handler.generate(request, FakeContext()))
    assert not engine.calls


def test_the_probe_frames_round_trip_and_a_bad_room_is_refused():
    assert decode(frame(ProbeKV(5))[HEADER.size:]) == ProbeKV(5)
    assert decode_to_decode(frame(KVProbed(5, "x"))[HEADER.size:]) == KVProbed(5, "x")
    with pytest.raises(msgspec.ValidationError):
        decode(frame(ProbeKV(0))[HEADER.size:])  # rooms start at 1


@pytest.mark.parametrize("own_probe, switch, probes", [
    (False, None, True),  # SGLang's NIXL path: the worker probes it
    (True, None, False),  # the CPU engine's transport probes its own
    (False, "0", False),  # DYN_KV_PATH_PROBE=0
])
def test_the_decode_probes_only_a_path_its_engine_does_not_check(monkeypatch, own_probe, switch,
                                                                 probes):
    if switch is None:
        monkeypatch.delenv("DYN_KV_PATH_PROBE", raising=False)
    else:
        monkeypatch.setenv("DYN_KV_PATH_PROBE", switch)
    config = SimpleNamespace(backend=SimpleNamespace(probes_own_kv_path=own_probe))
    got = kv_path_probe(config, FakeEngine(), RoomClaims(None))
    assert isinstance(got, KVPathProbe) is probes
    assert kv_path_probe(config, FakeEngine(), None) is None  # no room watch: nothing to ask
