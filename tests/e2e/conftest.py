"""Fixtures for end-to-end tests: real frontend, real workers on the CPU engine or on the real
SGLang engine (SGLang's own CPU path), real NIXL.

Topologies (`tests/support/topologies.py`) are started once per test module and shared by its tests: one
with the frontend tokenizing (Tokens mode; once per orchestration style, so the module's checks
hold for both), one with the workers tokenizing (Text mode, decode-orchestrated: the frontend
orchestrates only Tokens-mode models). The
SGLang ones serve `tiny-sglang` (aggregated, or disaggregated) next to the CPU engine's
`tiny-agg`, the reference for greedy output.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from harness.topology import Stack
from tests.support.topologies import DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED


@pytest.fixture(scope="module", params=[DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED],
                ids=["decode-orch", "frontend-orch"])
def tokens_stack(start_stack, request) -> Iterator[Stack]:
    stack = start_stack(f"tokens-{request.param}", skip_tokenizer_init=True,
                        orchestrator=request.param)
    yield stack
    stack.stop()  # before the next style's stack starts (the module's other stacks stay up)


@pytest.fixture(scope="module")
def text_stack(start_stack) -> Stack:
    return start_stack("text", skip_tokenizer_init=False)


@pytest.fixture
def http(request) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client
