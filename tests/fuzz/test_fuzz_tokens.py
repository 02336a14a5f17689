"""Request fuzz, Tokens mode (--skip-tokenizer-init), through the real frontend to an
aggregated worker and to a decode worker with its prefill worker (in both orchestration
styles: the decode worker calls its prefill, or the frontend sends both legs): malformed and extreme
shapes get a 4xx with a message, random ones never a 5xx, and a concurrent well-formed stream
ends exactly as it does alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.topology import Stack
from tests.fuzz import runner
from tests.fuzz.cases import EXTREME, TOKENS_CASES
from tests.support.shared_stacks import TOKENS, TOKENS_FRONTEND, lease

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(runner.TIMEOUT_S)]

# Cases whose 5xx comes from inside components/engine/ (model:case -> cause).
ENGINE_5XX: dict[str, str] = {}


@pytest.fixture(scope="module", params=[TOKENS, TOKENS_FRONTEND],
                ids=["decode-orch", "frontend-orch"])
def stack(request) -> Iterator[Stack]:
    """Shared with the other modules on these keys (tests/support/shared_stacks.py)."""
    yield from lease(request, request.param)


@pytest.fixture(scope="module")
def witness(stack):
    yield from runner.witness_for(stack)


@pytest.mark.parametrize("model, path, body, must_reject",
                         runner.params(TOKENS_CASES, EXTREME, ENGINE_5XX))
def test_fixed_shape_is_answered_without_a_5xx(stack, witness, model, path, body, must_reject):
    """Malformed shapes: a 4xx with a message; extreme but valid ones: anything but a 5xx."""
    runner.check_fixed_case(stack, model, path, body, must_reject)


def test_random_shapes_never_get_a_5xx(stack, witness):
    assert runner.check_random_requests(stack, "tokens") > 0


def test_the_concurrent_stream_finished_untouched(witness):
    runner.check_witness(witness)
