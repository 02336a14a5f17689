"""Fixtures for end-to-end tests: real frontend, real workers on the CPU engine or on the real
SGLang engine (SGLang's own CPU path), real NIXL.

The standard topologies (`tests/support/topologies.py`) are shared by the modules that only send
requests, one alive at a time (`tests/support/shared_stacks.py`): one with the frontend tokenizing
(Tokens mode; once per orchestration style, so a module's checks hold for both), one with the
workers tokenizing (Text mode, decode-orchestrated: the frontend orchestrates only Tokens-mode
models). The
SGLang ones serve `tiny-sglang` (aggregated, or disaggregated) next to the CPU engine's
`tiny-agg`, the reference for greedy output.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from harness.topology import Stack
from tests.support.shared_stacks import TEXT, TOKENS, TOKENS_FRONTEND, lease


@pytest.fixture(scope="module", params=[TOKENS, TOKENS_FRONTEND],
                ids=["decode-orch", "frontend-orch"])
def tokens_stack(request) -> Iterator[Stack]:
    yield from lease(request, request.param)


@pytest.fixture(scope="module")
def text_stack(request) -> Iterator[Stack]:
    """A module using it declares `SHARED_STACK = TEXT` (the suite orders tests by it)."""
    yield from lease(request, TEXT)


@pytest.fixture
def http(request) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client
