"""The worker owns SIGTERM and SIGINT on its event loop, whatever the engine registers later.

SGLang's TokenizerManager installs its own SIGTERM handler on the running loop when it serves its
first request (`auto_create_handle_loop`). That would replace the worker's: a SIGTERM after
traffic would then neither unregister the model nor drain, and SGLang's watchdog would exit from
inside a task. Dynamo's own SGLang worker guards against this the same way: later registrations
for these signals are refused (and logged), everything else passes through.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Callable

logger = logging.getLogger(__name__)

OWNED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalGuard:
    def __init__(self, loop: asyncio.AbstractEventLoop,
                 signals: tuple[int, ...] = OWNED_SIGNALS) -> None:
        self._loop = loop
        self._signals = signals
        self._add = loop.add_signal_handler
        self.refused: list[tuple[int, Callable[..., Any]]] = []

    def take(self, callback: Callable[[], Any]) -> None:
        """Install `callback` for the owned signals and refuse any later replacement."""
        for sig in self._signals:
            self._add(sig, callback)
        self._loop.add_signal_handler = self._add_unless_owned  # type: ignore[method-assign]

    def _add_unless_owned(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
        if sig in self._signals:
            logger.info("kept the worker's %s handler; refused %r", signal.Signals(sig).name,
                        callback)
            self.refused.append((sig, callback))
            return None
        return self._add(sig, callback, *args)
