"""Aborts that SGLang 0.5.23 cannot lose (docs/failure-behaviour.md).

SGLang's `TokenizerManager.abort_request(rid)` marks the rid's state `abort_sent` and sends the
abort to the scheduler at once. A request whose state exists but that is not dispatched yet
(still being tokenized or validated) is not on the scheduler: the abort matches nothing there,
the request arrives after it and runs to its end, and every later abort of the rid is skipped as
already sent. A prefill request then waits out SGLang's bootstrap timeout (300 s) for a decode
that never comes. Dynamo 1.6.1 orders its aborts after dispatch for the same reason; here the
engine's own `abort_request` is wrapped once, so every caller (the handlers' guards) gets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

DISPATCH_WAIT_S = 30.0  # as Dynamo's ordered cancellation waits for a rid to be dispatched
POLL_S = 0.005


def aborts_are_ordered(tokenizer_manager: Any) -> bool:
    return getattr(getattr(tokenizer_manager, "abort_request", None), "ordered", False)


def order_aborts(tokenizer_manager: Any) -> None:
    """Make `abort_request` of an undispatched rid wait for its dispatch (on the event loop).
    Left as SGLang's own when its request table does not look as read here (then the worker
    does not advertise that a prefill may be cancelled at any point)."""
    states = getattr(tokenizer_manager, "rid_to_state", None)
    if not isinstance(states, Mapping):
        logger.warning("SGLang's TokenizerManager has no rid_to_state mapping: aborts unordered")
        return
    send = tokenizer_manager.abort_request
    pending: set[str] = set()

    def abort_request(rid: str = "", abort_all: bool = False) -> None:
        state = None if abort_all or not rid else tokenizer_manager.rid_to_state.get(rid)
        if state is None or getattr(state, "dispatched", True) or state.abort_sent:
            send(rid=rid, abort_all=abort_all)
        elif rid not in pending:
            pending.add(rid)
            task = asyncio.get_running_loop().create_task(_after_dispatch(rid, state))
            task.add_done_callback(lambda _: pending.discard(rid))

    async def _after_dispatch(rid: str, state: Any) -> None:
        deadline = time.monotonic() + DISPATCH_WAIT_S
        while not state.dispatched and tokenizer_manager.rid_to_state.get(rid) is state:
            if time.monotonic() > deadline:
                logger.warning("request %s was not dispatched within %.0f s; aborting anyway",
                               rid, DISPATCH_WAIT_S)
                break
            await asyncio.sleep(POLL_S)
        if tokenizer_manager.rid_to_state.get(rid) is state:
            send(rid=rid)

    abort_request.ordered = True
    tokenizer_manager.abort_request = abort_request
