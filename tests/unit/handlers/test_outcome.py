"""One outcome vocabulary (handlers/core/outcome.py): what each way a stream ends counts as in
the worker's metric, and what the room watch is told."""

from __future__ import annotations

import asyncio

import pytest

from handlers.core.errors import (
    EngineError, EngineUnavailable, PrefillError, PrefillUnavailable, RequestError,
)
from handlers.core.guard import Stopped
from handlers.core.outcome import Outcome, outcome_of, outcome_of_stream


@pytest.mark.parametrize("exc, outcome, released", [
    (RequestError("bad"), Outcome.INVALID, "invalid"),
    (PrefillUnavailable("none"), Outcome.UNAVAILABLE, "failed"),
    (EngineUnavailable("full"), Outcome.UNAVAILABLE, "failed"),
    (Stopped(), Outcome.CANCELLED, "cancelled"),
    (GeneratorExit(), Outcome.CANCELLED, "cancelled"),
    (asyncio.CancelledError(), Outcome.CANCELLED, "cancelled"),
    (PrefillError("broke"), Outcome.ERROR, "failed"),
    (EngineError("broke"), Outcome.ERROR, "failed"),
    (ValueError("bug"), Outcome.ERROR, "failed"),
])
def test_an_exception_ends_a_stream_with_one_outcome(exc, outcome, released):
    assert outcome_of(exc) is outcome
    assert outcome.released_as == released


@pytest.mark.parametrize("finish, stopped, outcome", [
    ("length", False, Outcome.SUCCESS), ("stop", True, Outcome.SUCCESS),
    ("cancelled", False, Outcome.CANCELLED), (None, True, Outcome.CANCELLED),
    (None, False, Outcome.SUCCESS),
])
def test_a_stream_that_ended_by_itself(finish, stopped, outcome):
    assert outcome_of_stream(finish, stopped) is outcome
    assert Outcome.SUCCESS.released_as == "done"
