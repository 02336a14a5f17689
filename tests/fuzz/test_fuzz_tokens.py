"""Request fuzz, Tokens mode (--skip-tokenizer-init), through the real frontend to an
aggregated worker and to a decode worker with its prefill worker: malformed and extreme
shapes get a 4xx with a message, random ones never a 5xx, and a concurrent well-formed stream
ends exactly as it does alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import start_topology
from tests.e2e.stack import Stack
from tests.fuzz import runner
from tests.fuzz.cases import TOKENS_CASES

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.timeout(runner.TIMEOUT_S)]

# Cases whose 5xx comes from inside components/engine/ (model:case -> cause).
ENGINE_5XX: dict[str, str] = {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model_path) -> Iterator[Stack]:
    stack = start_topology(tmp_path_factory.mktemp("fuzz-tokens"), tiny_model_path, True)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def witness(stack):
    yield from runner.witness_for(stack)


@pytest.mark.parametrize("model, path, body", runner.xfail_engine(TOKENS_CASES, ENGINE_5XX))
def test_malformed_shape_is_a_4xx_with_a_message(stack, witness, model, path, body):
    runner.check_fixed_case(stack, model, path, body)


def test_random_shapes_never_get_a_5xx(stack, witness):
    assert runner.check_random_requests(stack, "tokens") > 0


def test_the_concurrent_stream_finished_untouched(witness):
    runner.check_witness(witness)
