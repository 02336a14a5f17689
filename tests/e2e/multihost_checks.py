"""What the two-host modules share (test_e2e_multihost.py: the CPU engine;
test_e2e_multihost_sglang.py: `--engine sglang`): the hosts and their services as module
fixtures, starting a split stack, and the checks run on one (exactness against the aggregated
reference, clients leaving, serving again after a restart)."""

from __future__ import annotations

import time

import httpx
import pytest

from harness.multihost import HostStack
from harness.netns import Hosts, unavailable
from tests.e2e.client import user
from tests.support.multihost import start_services, start_split
from tests.support.topologies import AGG

PROMPTS = ("Tell me about two hosts.", "Count to five, slowly.", "A B C D E F G")
RELEASE_BOUND_S = 10.0  # the prefill holds nothing this long after its clients left
FAIL_BOUND_S = 35.0  # a request into a dead prefill ends within this (the 30 s KV wait, + slack)
RETURN_S = 90.0  # a restarted worker serves within this


@pytest.fixture(scope="module")
def hosts():
    why = unavailable()
    if why:
        pytest.skip(why)
    made = Hosts().create()
    yield made
    assert made.remove() == []


@pytest.fixture(scope="module")
def services(hosts, tmp_path_factory):
    started = start_services(tmp_path_factory.mktemp("mh-services"), hosts)
    yield started
    started.stop()


def start_timed(tmp_path_factory, model_path: str, hosts, services, name: str,
                **kwargs) -> HostStack:
    t0 = time.monotonic()
    stack = start_split(tmp_path_factory.mktemp(name), model_path, hosts, services, **kwargs)
    print(f"{name}: first request served {time.monotonic() - t0:.1f} s after start")
    return stack


def greedy(stack: HostStack, model: str, prompt: str, timeout: float = 60) -> str:
    body = {"model": model, "messages": user(prompt), "max_tokens": 12, "temperature": 0}

    def ask() -> str:
        r = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=timeout)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    return stack.call(ask)


def assert_exact(stack: HostStack, model: str) -> None:
    for prompt in PROMPTS:
        assert greedy(stack, model, prompt) == greedy(stack, AGG, prompt), prompt


def leave_after_headers(stack: HostStack, model: str, i: int) -> None:
    body = {"model": model, "prompt": [7 + i] + [9] * 1500, "max_tokens": 200,
            "ignore_eos": True, "stream": True}

    def leave() -> None:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{stack.url}/v1/completions", json=body) as r:
                assert r.status_code == 200  # headers only: close before any token is read

    stack.call(leave)  # each thread enters host A itself (namespaces are per thread)


def idle(stack: HostStack, name: str) -> bool:
    """No request in flight and (the CPU engine; SGLang reports none) no KV page in use."""
    return (stack.route(name, "requests")["in_flight"] == 0
            and not stack.route(name, "kv_pages")["pages_in_use"])


def serves(stack: HostStack, model: str) -> bool:
    # Until a killed worker's lease expires the frontend still routes some requests to it (a
    # 503): served means every one of several in a row succeeds.
    try:
        return all(greedy(stack, model, "back?", timeout=15) for _ in range(6))
    except AssertionError:
        return False
