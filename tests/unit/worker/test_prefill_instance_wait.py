"""A decode-orchestrated decode waits at startup for a prefill instance: long enough by default
for a prefill's load and warm-up (which on GPUs outlast the decode's own load), saying so
periodically, and exits naming `--prefill-instance-timeout` when none came."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from components.worker.lifecycle import startup
from components.worker.flags.config import parse_args

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("cpu_machine")]

DECODE = ["--model-path", "/models/tiny", "--disaggregation-mode", "decode"]


class FakeRuntime:
    """A prefill endpoint whose first instance appears when `appear` is set."""

    def __init__(self) -> None:
        self.appear = asyncio.Event()

    def endpoint(self, path: str):
        async def client():
            async def wait_for_instances():
                await self.appear.wait()
                return [0xab]

            return SimpleNamespace(wait_for_instances=wait_for_instances)

        return SimpleNamespace(client=client)


def test_the_default_wait_outlasts_a_prefills_warm_up_bound():
    # Dynamo 1.6.1 bounds the prefill's warm-up alone at 1800 s; its load comes first.
    assert parse_args(DECODE).dynamo.prefill_instance_timeout > 1800
    assert parse_args([*DECODE, "--prefill-instance-timeout", "90"]
                      ).dynamo.prefill_instance_timeout == 90


async def test_the_wait_is_logged_until_a_prefill_appears(monkeypatch, caplog):
    monkeypatch.setattr(startup, "PREFILL_WAIT_LOG_INTERVAL_S", 0.01)
    runtime = FakeRuntime()

    class AppearOnSecondNotice(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notices = [r for r in caplog.records if "still waiting" in r.getMessage()]
            if len(notices) >= 2:
                runtime.appear.set()

    handler = AppearOnSecondNotice()
    logging.getLogger(startup.__name__).addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger=startup.__name__):
            await startup.connect_prefill(runtime, parse_args(DECODE))
    finally:
        logging.getLogger(startup.__name__).removeHandler(handler)
    notices = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert len(notices) >= 2 and "--prefill-instance-timeout" in notices[0]
    assert "prefill instances: ['ab']" in caplog.text


async def test_no_prefill_within_the_bound_exits_naming_the_flag():
    config = parse_args([*DECODE, "--prefill-instance-timeout", "0.05"])
    with pytest.raises(SystemExit, match="--prefill-instance-timeout"):
        await startup.connect_prefill(FakeRuntime(), config)
