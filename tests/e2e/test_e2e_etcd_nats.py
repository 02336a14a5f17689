"""The production discovery stack: etcd discovery and the NATS request plane
(`--discovery-backend etcd --request-plane nats`, reached through ETCD_ENDPOINTS and NATS_SERVER),
with the standard topology (frontend, prefill + decode serving `tiny`, aggregated `tiny-agg`) on
real etcd and NATS servers (`harness/services.py`).

Checks: every worker registers in etcd and is reached over NATS; disaggregated greedy output
equals aggregated, in Tokens and Text mode; a killed decode or prefill worker's registration goes
when its etcd lease expires, and a replacement brings the service back within a bounded wait.
"""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from harness.services import Services
from harness.topology import Stack, wait_until
from tests.e2e.client import chat, user
from tests.support.topologies import AGG, DISAGG, ENGINE_ARGS, start_decode, start_prefill

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# A short etcd lease (Dynamo's ETCD_LEASE_TTL, seconds) so a dead worker's keys go quickly.
LEASE_TTL_S = 5
LEASE_EXPIRY_S = 30.0  # bound on etcd dropping a dead worker's keys (the lease TTL, with room)
RETURN_S = 90.0  # bound on a replacement worker serving again
PROMPTS = ("Tell me about etcd.", "Count to five, slowly.")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    services = Services(tmp_path_factory.mktemp("services")).start()
    yield services
    services.stop()


def start_etcd_stack(workdir, model_path: str, services: Services,
                     skip_tokenizer_init: bool) -> Stack:
    stack = Stack(workdir, model_path, discovery_backend="etcd", request_plane="nats",
                  services_env={**services.env(), "ETCD_LEASE_TTL": str(LEASE_TTL_S)},
                  namespace=f"etcd{int(skip_tokenizer_init)}")
    try:
        stack.start_frontend()
        start_prefill(stack, "prefill", skip_tokenizer_init)
        start_decode(stack, "decode", skip_tokenizer_init)
        stack.start_worker("agg", "null", AGG, *ENGINE_ARGS,
                           "--endpoint", f"dyn://{stack.namespace}.agg.generate",
                           skip_tokenizer_init=skip_tokenizer_init)
        stack.wait_ready(DISAGG, AGG, probe=True)
    except BaseException:
        print(stack.logs())
        stack.stop()
        raise
    return stack


@pytest.fixture(scope="module")
def etcd_stack(tmp_path_factory, tiny_model_path, services):
    stack = start_etcd_stack(tmp_path_factory.mktemp("etcd-tokens"), tiny_model_path, services,
                             skip_tokenizer_init=True)
    yield stack
    stack.stop()


def instances(services: Services, namespace: str, component: str) -> dict[str, dict]:
    prefix = f"v1/instances/{namespace}/{component}/generate/"
    return {k[len(prefix):]: json.loads(v) for k, v in services.etcd_items(prefix).items()}


def greedy(http: httpx.Client, url: str, model: str, prompt: str) -> str:
    body = {"model": model, "messages": user(prompt), "max_tokens": 12, "temperature": 0}
    return chat(http, url, body)["choices"][0]["message"]["content"]


def assert_disagg_equals_agg(stack: Stack, http: httpx.Client) -> None:
    for prompt in PROMPTS:
        assert greedy(http, stack.url, DISAGG, prompt) == greedy(http, stack.url, AGG, prompt)


def test_workers_register_in_etcd_and_serve_over_nats(etcd_stack, services):
    ns = etcd_stack.namespace
    for component in ("prefill", "backend", "agg"):
        found = instances(services, ns, component)
        assert len(found) == 1, (component, found)
        (instance,) = found.values()
        assert "nats" in json.dumps(instance["transport"]).lower(), instance
    cards = services.etcd_items(f"v1/mdc/{ns}/")
    assert {json.loads(v)["card_json"]["display_name"] for v in cards.values()} == {DISAGG, AGG}
    assert not etcd_stack.kv_dir.joinpath("v1").exists()  # nothing went to file discovery


def test_disagg_equals_agg_tokens(etcd_stack, http):
    assert_disagg_equals_agg(etcd_stack, http)


def test_disagg_equals_agg_text(tmp_path_factory, tiny_model_path, services, http):
    stack = start_etcd_stack(tmp_path_factory.mktemp("etcd-text"), tiny_model_path, services,
                             skip_tokenizer_init=False)
    try:
        assert_disagg_equals_agg(stack, http)
    finally:
        stack.stop()


def kill(stack: Stack, name: str) -> None:
    """SIGKILL a worker's group: no unregistering, only its etcd lease can remove it."""
    proc = stack.procs.pop(name)
    proc.signal_group(signal.SIGKILL)
    proc.popen.wait(10)


def serves(stack: Stack, http: httpx.Client) -> bool:
    body = {"model": DISAGG, "messages": user("back?"), "max_tokens": 2}
    return http.post(f"{stack.url}/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_worker_restart(etcd_stack, services, http, role):
    component = "backend" if role == "decode" else "prefill"
    ns = etcd_stack.namespace
    (dead,) = instances(services, ns, component)
    kill(etcd_stack, role)
    start = time.monotonic()
    wait_until(lambda: dead not in instances(services, ns, component), LEASE_EXPIRY_S,
               f"etcd to drop the killed {role}'s instance {dead}")
    expired = time.monotonic() - start
    new_name = f"{role}-2"
    if role == "decode":
        start_decode(etcd_stack, new_name, skip_tokenizer_init=True)
    else:
        start_prefill(etcd_stack, new_name, skip_tokenizer_init=True)
    wait_until(lambda: serves(etcd_stack, http), RETURN_S, f"service back after the {role} restart",
               interval=0.5)
    etcd_stack.procs[role] = etcd_stack.procs.pop(new_name)  # the next test finds it by role
    assert list(instances(services, ns, component)) != [dead]
    assert len(instances(services, ns, component)) == 1
    print(f"{role}: lease expired after {expired:.1f} s")
    assert_disagg_equals_agg(etcd_stack, http)
