"""The three fuzz tests each mode runs, written once: fixed shapes must be 4xx with a message,
random shapes must never be 5xx, and the witness stream must be untouched. A mode's module
binds them to its stack (see test_fuzz_tokens.py, test_fuzz_text.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.topologies import AGG, DISAGG
from tests.fuzz.probes import (
    DURATION_S,
    REQUEST_TIMEOUT_S,
    SEED,
    Witness,
    judge,
    random_body,
    random_rounds,
    send,
)

MODELS = [DISAGG, AGG]
# Room for stack start-up, the fixed cases and the random phase (FUZZ_DURATION_S when set).
TIMEOUT_S = int(DURATION_S) + 600


def witness_for(stack: Any) -> Iterator[Witness]:
    witness = Witness(stack.url, MODELS)
    witness.start()
    yield witness
    witness.stop()


def check_fixed_case(stack: Any, model: str, path: str, body: Any, must_reject: bool) -> None:
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
        r = send(http, stack.url, path, model, body)
    problem = judge(r, must_reject=must_reject)
    assert not problem, problem


def check_random_requests(stack: Any, mode: str) -> int:
    rng = random.Random(f"{SEED}-{mode}")
    problems: list[str] = []
    sent = 0
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
        for _ in random_rounds(rng):
            body = random_body(rng)
            for model in MODELS:
                r = send(http, stack.url, "chat/completions", model, body)
                sent += 1
                problem = judge(r, must_reject=False)
                if problem:
                    problems.append(f"{model} {body!r:.400}: {problem}")
    assert not problems, "\n".join(problems[:10])
    return sent


def check_witness(witness: Witness) -> None:
    witness.stop()
    assert witness.runs, "the witness stream never ran during the fuzz"
    mismatches = witness.mismatches()
    assert not mismatches, "\n".join(mismatches[:5])


def params(malformed: list[tuple[str, str, Any]], extreme: list[tuple[str, str, Any]],
           engine_5xx: dict[str, str]) -> list[Any]:
    """Parametrize (model, path, body, must_reject); a case known to get a 5xx from inside the
    engine is a strict xfail naming the cause."""
    out = []
    for model in MODELS:
        for cases, must_reject in ((malformed, True), (extreme, False)):
            for case_id, path, body in cases:
                reason = engine_5xx.get(f"{model}:{case_id}")
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                out.append(pytest.param(model, path, body, must_reject,
                                        id=f"{model}-{case_id}", marks=marks))
    return out
