"""The one wrapper around a handler's `generate`, where each request's outcome
(handlers/core/outcome.py) is decided once and then counted (the `requests` metric), logged, and
answered to the frontend as Dynamo 1.6.1 shows it:

- invalid (`RequestError`): `InvalidArgument`, an HTTP 400 with the message;
- unavailable (`PrefillUnavailable`, `EngineUnavailable`): `HttpError(503)`; the 1.6.1 frontend
  shows its own words ("Internal server error", or "Service temporarily unavailable" in a
  stream), so the reason is logged here;
- error: the exception as it is (HTTP 500), logged with its traceback;
- cancelled: the client or the runtime ended it; it ends as it was ended.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from dynamo.llm.exceptions import HttpError, InvalidArgument

from components.worker.metrics.worker_metrics import WorkerMetrics
from handlers.core.outcome import Outcome, outcome_of, outcome_of_stream

logger = logging.getLogger(__name__)

Handler = Callable[..., AsyncIterator[dict[str, Any]]]


def endpoint(generate: Handler, metrics: WorkerMetrics, streams_tokens: bool = True) -> Handler:
    """`generate` as the endpoint serves it; `streams_tokens=False` for a prefill worker, whose
    items are hand-off messages (no inter-token latency)."""

    async def serve(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
        timing = metrics.start_request(streams_tokens)
        outcome = Outcome.ERROR
        try:
            async for item in generate(request, context):
                timing.item(item)
                yield item
            outcome = outcome_of_stream(timing.finish,
                                        context is not None and context.is_stopped())
        except BaseException as exc:
            outcome = outcome_of(exc)
            answer = _answer(outcome, exc, context)
            if answer is exc:
                raise
            raise answer from None
        finally:
            timing.end(outcome)

    return serve


def _answer(outcome: Outcome, exc: BaseException, context: Any) -> BaseException:
    """What the frontend gets for a request that `exc` ended (called while it is handled)."""
    rid = context.id() if context is not None else "-"
    if outcome is Outcome.INVALID:
        logger.info("request %s rejected: %s", rid, exc)
        return InvalidArgument(str(exc))
    if outcome is Outcome.UNAVAILABLE:
        logger.warning("request %s: %s", rid, exc)
        return HttpError(503, str(exc))
    if outcome is Outcome.ERROR and isinstance(exc, Exception):
        logger.exception("request %s failed", rid)
    return exc
