"""What differs between the SGLang releases the component supports (0.5.21 and 0.5.23), decided
in components/backends/sglang_compat.py from SGLANG_VERSION alone; here against a stand-in with
SGLang 0.5.21's TokenizerManager behaviour on parallel sampling (n > 1)."""

from __future__ import annotations

import importlib.metadata
from types import SimpleNamespace

import pytest
from packaging.version import Version

from components.backends import sglang_compat

pytestmark = pytest.mark.timeout(10)


class StandIn:
    """0.5.21's `_handle_batch_request` for one prompt with n samples: the states of the
    request's own rids were made before, the samples run under fresh rids, and only the first
    own rid's state is dropped."""

    def __init__(self) -> None:
        self.rid_to_state: dict = {}

    async def _handle_batch_request(self, obj, request=None, request_rids=None):
        for i in range(obj.parallel_sample_num):
            self.rid_to_state[f"sample{i}"] = SimpleNamespace(dispatched=True)
        del self.rid_to_state[obj.rid[0]]
        for i in range(obj.parallel_sample_num):
            yield {"sample": i}
            del self.rid_to_state[f"sample{i}"]


def _request(manager: StandIn, n: int) -> SimpleNamespace:
    obj = SimpleNamespace(rid=[f"r_{i}" for i in range(n)], parallel_sample_num=n)
    for rid in obj.rid:
        manager.rid_to_state[rid] = SimpleNamespace(dispatched=False)
    return obj


def test_sglang_version_is_the_installed_distributions():
    assert sglang_compat.SGLANG_VERSION == Version(importlib.metadata.version("sglang"))


async def test_on_0_5_21_the_own_rids_states_go_once_the_samples_run(monkeypatch):
    monkeypatch.setattr(sglang_compat, "SGLANG_VERSION", Version("0.5.21"))
    manager = StandIn()
    sglang_compat.sglang_adapt_tokenizer_manager(manager)
    seen = [sorted(manager.rid_to_state)
            async for _ in manager._handle_batch_request(_request(manager, 3))]
    assert seen[0] == ["sample0", "sample1", "sample2"]  # r_1 and r_2 gone at the first output
    assert manager.rid_to_state == {}


async def test_on_0_5_21_a_closed_request_leaves_nothing_either(monkeypatch):
    monkeypatch.setattr(sglang_compat, "SGLANG_VERSION", Version("0.5.21"))
    manager = StandIn()
    sglang_compat.sglang_adapt_tokenizer_manager(manager)
    stream = manager._handle_batch_request(_request(manager, 2))
    await stream.__anext__()
    await stream.aclose()
    assert sorted(manager.rid_to_state) == ["sample0", "sample1"]  # SGLang's own to end


async def test_on_0_5_23_the_manager_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(sglang_compat, "SGLANG_VERSION", Version("0.5.23"))
    manager = StandIn()
    handle = manager._handle_batch_request
    sglang_compat.sglang_adapt_tokenizer_manager(manager)
    assert manager._handle_batch_request == handle
    seen = [sorted(manager.rid_to_state)
            async for _ in manager._handle_batch_request(_request(manager, 2))]
    assert seen[0] == ["r_1", "sample0", "sample1"]  # what the repair removes on 0.5.21
