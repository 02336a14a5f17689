"""A failed model registration stops the worker loudly: the error names the model and the
runtime is shut down, so no half-served endpoint stays behind (fakes for the Dynamo runtime)."""

import asyncio
from types import SimpleNamespace

import pytest

from components.backends import select as backend_select
from components.worker import serving as worker
from components.worker.lifecycle import register
from components.worker.flags.config import parse_args
from components.backends.limits import EngineLimits
from components.worker.lifecycle.register import RegistrationError, register_served_model

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
                runtime.serving = asyncio.get_running_loop().create_future()  # never resolves
                return runtime.serving

        return Endpoint()

    def shutdown(self) -> None:
        self.shutdowns += 1


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
