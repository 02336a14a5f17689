"""An SGLang engine over several nodes (`--nnodes`), as Dynamo 1.6.1's worker runs one, read
from the real `ServerArgs` parse: the first node registers the engine's group id and
advertises `--dist-init-addr`'s host as the bootstrap host; a later node serves and registers
nothing, starts no tokenizer workers, and relays its own DP ranks' KV events (attention DP
only) under the first node's instance id."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from components.backends import select as backend_select
from components.backends.node import WORKER_GROUP_ID_KEY
from components.worker.lifecycle import follower
from components.worker.metrics import kv_events
from components.worker.flags.config import parse_args

pytestmark = pytest.mark.timeout(60)

KV = '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
GROUP = "dist_init:tcp://10.0.0.1:5000"


@pytest.fixture(autouse=True)
def _sglang_on_cpu(monkeypatch):
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")


def config_for(model: str, rank: int, *extra: str, addr: str = "10.0.0.1:5000"):
    return parse_args(["--engine", "sglang", "--model-path", model, "--tp", "4",
                       "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", addr,
                       *extra])


@pytest.mark.parametrize("extra, relays", [
    (("--attn-dp-size", "4"), True),  # each node has its own ranks
    (("--dp-size", "4", "--enable-dp-attention"), True),  # the deprecated spelling
    ((), False),  # TP only: the nodes share the first node's one rank
])
def test_a_later_nodes_place_follows_dynamo(tiny_model_path, extra, relays):
    node = config_for(tiny_model_path, 1, *extra).node
    assert (node.rank, node.first, node.group_id) == (1, False, GROUP)
    assert node.relays_kv_events is relays
    first = config_for(tiny_model_path, 0, *extra).node
    assert first.first and first.relays_kv_events and first.group_id == GROUP
    single = parse_args(["--engine", "sglang", "--model-path", tiny_model_path]).node
    assert single.first and single.group_id is None


def test_the_first_node_registers_the_group_id(tiny_model_path):
    from components.backends.limits import EngineLimits
    from components.worker.lifecycle.register import runtime_config_for

    limits = EngineLimits(context_length=2048, max_total_num_tokens=4096,
                          max_running_requests=8, page_size=16)
    runtime = runtime_config_for(limits, config_for(tiny_model_path, 0))
    assert runtime.get_engine_specific(WORKER_GROUP_ID_KEY) == GROUP  # set as JSON, read back


@pytest.mark.parametrize("addr, host", [("10.0.0.1:5000", "10.0.0.1"), ("[::1]:5000", "[::1]")])
def test_the_bootstrap_host_is_dist_init_addrs(tiny_model_path, addr, host):
    from components.worker.handler_factory import bootstrap_endpoint

    config = config_for(tiny_model_path, 0, "--disaggregation-mode", "prefill",
                        "--skip-tokenizer-init", addr=addr)
    engine = SimpleNamespace(server_args=config.engine_args)
    assert bootstrap_endpoint(config, engine) == (host, config.bootstrap_port)


def test_a_later_node_starts_no_tokenizer_workers(tiny_model_path, monkeypatch):
    from components.worker.lifecycle import startup

    config = config_for(tiny_model_path, 1, "--tokenizer-worker-num", "2")
    monkeypatch.setattr(type(config.backend), "build", lambda self, args: "engine")
    monkeypatch.setattr(startup.TokenizerWorkers, "start",
                        lambda *a: pytest.fail("tokenizer workers on a later node"))
    assert startup.start_engine(config, []) == ("engine", None)


class FakeRuntime:
    def __init__(self) -> None:
        self.lookups: list[tuple] = []

    def endpoint(self, path: str):
        async def client():
            async def by_data(key, value, timeout_s=None):
                self.lookups.append((path, key, value))
                return 0x77

            return SimpleNamespace(wait_for_instance_by_runtime_data=by_data)

        # No serve_endpoint: a later node must not serve.
        return SimpleNamespace(client=client)


async def test_a_later_node_relays_its_ranks_under_the_first_nodes_id(tiny_model_path,
                                                                       monkeypatch):
    made, relaying = [], asyncio.Event()

    class Publisher:
        def __init__(self, **kwargs):
            made.append(kwargs)
            relaying.set()

        def shutdown(self):
            pass

    monkeypatch.setattr(kv_events, "KvEventPublisher", Publisher)
    config = config_for(tiny_model_path, 1, "--attn-dp-size", "4", "--page-size", "16",
                        "--kv-events-config", KV)
    runtime = FakeRuntime()
    task = asyncio.ensure_future(follower.follow(runtime, config,
                                                 SimpleNamespace(server_args=config.engine_args)))
    await asyncio.wait_for(relaying.wait(), 10)
    assert not task.done()  # keeps the engine up until stopped
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runtime.lookups == [("dynamo.backend.generate", WORKER_GROUP_ID_KEY, GROUP)]
    assert [(kw["dp_rank"], kw["zmq_endpoint"], kw["worker_id"], kw["kv_block_size"])
            for kw in made] == [(2, "tcp://127.0.0.1:5559", 0x77, 16),
                                (3, "tcp://127.0.0.1:5560", 0x77, 16)]
