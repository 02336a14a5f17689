"""A failed model registration stops the worker loudly: the error names the model and the
runtime is shut down, so no half-served endpoint stays behind; a stop signal while the model
registers undoes the whole registration (fakes for the Dynamo runtime)."""

import asyncio
import logging
from types import SimpleNamespace

import pytest

from components.backends import select as backend_select
from components.worker import serving as worker
from components.worker.lifecycle import register
from components.worker.flags.config import parse_args
from components.backends.limits import EngineLimits
from components.worker.lifecycle.register import RegistrationError, register_served_model
from tests.support.handler_fakes import wait_until

pytestmark = pytest.mark.timeout(30)

LIMITS = EngineLimits(context_length=2048, max_total_num_tokens=4096, max_running_requests=8,
                      page_size=16)


@pytest.fixture
def config(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    return parse_args(["--model-path", "/models/tiny", "--served-model-name", "tiny",
                       "--skip-tokenizer-init"])


class FakeRuntime:
    def __init__(self) -> None:
        self.shutdowns = 0
        self.serving = None

    def endpoint(self, path):
        runtime = self

        class Endpoint:
            def serve_endpoint(self, handler, **kwargs):
                runtime.serving = asyncio.get_running_loop().create_future()  # until shutdown
                return runtime.serving

            async def unregister_endpoint_instance(self):
                pass

        return Endpoint()

    def shutdown(self) -> None:
        self.shutdowns += 1
        if self.serving is not None and not self.serving.done():
            self.serving.set_result(None)


async def test_registration_failure_names_the_model(monkeypatch, config):
    async def refuse(*args, **kwargs):
        raise Exception("model card store unavailable")

    monkeypatch.setattr(register, "register_model", refuse)
    with pytest.raises(RegistrationError, match="registering model 'tiny' failed: model card"):
        await register_served_model(object(), config, LIMITS)


async def test_worker_shuts_the_runtime_down_when_registration_fails(monkeypatch, config):
    async def refuse(endpoint, cfg, limits, bootstrap=None, kv_events=False):
        raise RegistrationError("registering model 'tiny' failed: no")

    monkeypatch.setattr(worker, "register_served_model", refuse)
    monkeypatch.setattr(type(config.backend), "limits", lambda self, engine: LIMITS)
    engine = SimpleNamespace(tokenizer_manager=SimpleNamespace(tokenizer=None))
    runtime = FakeRuntime()
    handler = SimpleNamespace(generate=None)
    with pytest.raises(RegistrationError):
        await asyncio.wait_for(worker.Worker(config, runtime, engine).serve(handler), 10)
    assert runtime.shutdowns == 1


async def test_a_stop_while_the_model_registers_waits_for_it_then_undoes_it(monkeypatch, config,
                                                                          caplog):
    release, calls = asyncio.Event(), []

    async def slow(endpoint, cfg, limits, bootstrap=None, kv_events=False):
        calls.append("registering")
        await release.wait()
        calls.append("registered")

    async def unregister(endpoint):
        calls.append("unregistered")

    monkeypatch.setattr(worker, "register_served_model", slow)
    monkeypatch.setattr(worker, "unregister_served_model", unregister)
    monkeypatch.setattr(worker, "get_grace_period_seconds", lambda: 60.0)  # only once ready
    monkeypatch.setattr(type(config.backend), "limits", lambda self, engine: LIMITS)
    engine = SimpleNamespace(tokenizer_manager=SimpleNamespace(tokenizer=None))
    served = worker.Worker(config, FakeRuntime(), engine)
    caplog.set_level(logging.INFO, logger=worker.__name__)
    serving = asyncio.ensure_future(served.serve(SimpleNamespace(generate=None)))
    await wait_until(lambda: calls == ["registering"])
    stopping = asyncio.ensure_future(served.stop())
    await wait_until(lambda: "shutting down" in caplog.text)
    release.set()
    await asyncio.wait_for(asyncio.gather(stopping, serving), 10)
    assert calls == ["registering", "registered", "unregistered"]
    assert "nothing was served" in caplog.text and "worker ready" not in caplog.text
    assert not served.ready
