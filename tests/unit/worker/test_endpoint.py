"""The endpoint wrapper (components/worker/lifecycle/endpoint.py) without a runtime: each
request's one outcome is the `requests` metric's label, the log line, and what the frontend
gets (400 with the message, 503, the exception itself); latencies are timed per item."""

import asyncio
import logging
from types import SimpleNamespace

import pytest
from dynamo.llm.exceptions import HttpError, InvalidArgument

from components.worker.lifecycle.endpoint import endpoint
from components.worker.metrics.worker_metrics import PREFIX, WorkerMetrics
from handlers.core.errors import EngineUnavailable, PrefillUnavailable, RequestError
from tests.unit.worker.test_metrics import FakeEngine, samples

STOPPED = SimpleNamespace(is_stopped=lambda: True, id=lambda: "rid-1")
# What ended the request -> (the metric's outcome, what the frontend gets, its HTTP status)
ENDINGS = [(RequestError("temperature: must be >= 0"), "invalid", InvalidArgument, 400),
           (PrefillUnavailable("prefill worker did not respond within 5 s"), "unavailable",
            HttpError, 503),
           (EngineUnavailable("engine unavailable: The request queue is full."), "unavailable",
            HttpError, 503),
           (RuntimeError("boom"), "error", RuntimeError, 500)]


def stream(*items, error=None):
    async def generate(request, context=None):
        for item in items:
            yield item
        if error is not None:
            raise error
    return generate


async def drain(gen, limit=None):
    out = []
    async for item in gen:
        out.append(item)
        if limit is not None and len(out) == limit:
            await gen.aclose()  # what the runtime does when the client goes away
            break
    return out


def requests_by_outcome(m: WorkerMetrics) -> dict:
    s = samples(m)
    return {o: s[(f"{PREFIX}_requests_total", o)]
            for o in ("success", "invalid", "unavailable", "error", "cancelled")}


@pytest.mark.parametrize("error, outcome, answer, status", ENDINGS,
                         ids=[e[1] + "-" + type(e[0]).__name__ for e in ENDINGS])
def test_one_outcome_is_counted_logged_and_answered(error, outcome, answer, status, caplog):
    m = WorkerMetrics(FakeEngine())
    caplog.set_level(logging.INFO, logger="components.worker.lifecycle.endpoint")
    context = SimpleNamespace(is_stopped=lambda: False, id=lambda: "rid-7")
    with pytest.raises(answer) as info:
        asyncio.run(drain(endpoint(stream(error=error), m)({}, context)))
    assert str(error) in str(info.value)
    assert getattr(info.value, "code", status) == status
    assert requests_by_outcome(m)[outcome] == 1 and sum(requests_by_outcome(m).values()) == 1
    [record] = [r for r in caplog.records if r.name == "components.worker.lifecycle.endpoint"]
    assert "rid-7" in record.getMessage()
    assert (record.exc_info is not None) == (outcome == "error")  # a 500's traceback


def test_a_stop_after_the_last_item_went_out_is_not_a_cancellation():
    m = WorkerMetrics(FakeEngine())
    # the decode closed the prefill's stream, after its done item and before it
    asyncio.run(drain(endpoint(stream({"room": 1}, {"finished": True}), m)({}, STOPPED)))
    asyncio.run(drain(endpoint(stream({"room": 1}), m)({}, STOPPED)))
    got = requests_by_outcome(m)
    assert (got["success"], got["cancelled"]) == (1, 1)


def test_latencies_and_cancellations():
    m = WorkerMetrics(FakeEngine())
    asyncio.run(drain(endpoint(stream({"token_ids": [1, 2]},
                                      {"token_ids": [3, 4], "finish_reason": "length"}), m)({})))
    # the client went away after the first item; the client stopped the request
    asyncio.run(drain(endpoint(stream({"token_ids": [1]}, {"token_ids": [2]}), m)({}), limit=1))
    asyncio.run(drain(endpoint(stream({"token_ids": [1]}), m)({}, STOPPED)))
    s = samples(m)
    assert requests_by_outcome(m) == {"success": 1, "invalid": 0, "unavailable": 0, "error": 0,
                                      "cancelled": 2}
    assert s[(f"{PREFIX}_time_to_first_token_seconds_count", "")] == 3
    assert s[(f"{PREFIX}_inter_token_latency_seconds_count", "")] == 1  # the one second chunk


def test_prefill_items_are_not_tokens():
    m = WorkerMetrics(FakeEngine())
    asyncio.run(drain(endpoint(stream({"a": 1}, {"b": 2}), m, streams_tokens=False)({})))
    assert samples(m)[(f"{PREFIX}_inter_token_latency_seconds_count", "")] == 0
