"""`--room-watch-port`: the prefill's room watch listens on a fixed port a firewall between nodes
can open (0, the default: a free port picked at startup); out of range is refused at parse
time, a port in use at startup, each naming the flag."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest

from components.worker.flags.config import parse_args
from components.worker.rooms.wiring import start_room_watch

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("cpu_machine")]

PREFILL = ["--model-path", "/models/tiny", "--disaggregation-mode", "prefill"]


class FakeRuntime:
    def __init__(self) -> None:
        self.endpoints: list[str] = []

    def endpoint(self, path: str):
        self.endpoints.append(path)

        async def serve_endpoint(handler):
            await asyncio.Event().wait()

        return SimpleNamespace(serve_endpoint=serve_endpoint)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_default_is_a_free_port_and_a_port_is_taken_as_given():
    assert parse_args(PREFILL).dynamo.room_watch_port == 0
    assert parse_args([*PREFILL, "--room-watch-port", "9123"]).dynamo.room_watch_port == 9123


@pytest.mark.parametrize("bad", ["-1", "65536", "port"])
def test_a_port_out_of_range_is_refused_naming_the_flag(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args([*PREFILL, "--room-watch-port", bad])
    assert "--room-watch-port" in capsys.readouterr().err


async def test_the_prefill_watches_on_the_given_port():
    port = free_port()
    runtime = FakeRuntime()
    config = parse_args([*PREFILL, "--room-watch-port", str(port)])
    server = await start_room_watch(runtime, config, ("127.0.0.1", 8998), None)
    try:
        assert server.port == port
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        assert runtime.endpoints == ["dynamo.prefill.room_watch"]
    finally:
        await server.close()


async def test_a_port_in_use_stops_startup_naming_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = parse_args([*PREFILL, "--room-watch-port", str(port)])
        with pytest.raises(SystemExit, match=f"--room-watch-port {port}"):
            await start_room_watch(FakeRuntime(), config, ("127.0.0.1", 8998), None)
