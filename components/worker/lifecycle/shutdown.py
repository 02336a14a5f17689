"""SIGTERM and SIGINT from the first line of startup to the last request.

While serving, a signal runs Dynamo 1.6.1's graceful sequence (its
`dynamo.common.utils.graceful_shutdown`): leave discovery first, keep serving for a grace period
while routers learn it (`DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS`, 5 s by default), then stop
taking requests and let those in flight finish. Dynamo bounds that drain (30 s); so does the
worker (`--drain-timeout`), after which it ends the live requests (a 503, or an error event in a
stream) and exits.

Before that, the engine is being built on the main thread (SGLang must be: it installs signal
handlers), so a signal cannot wait for the event loop: the handler raises StartupInterrupted
there, and the worker exits 0 without registering anything. SGLang's own child processes die
with this one (they ask Linux for SIGKILL when their parent exits).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from components.worker.lifecycle.tokenizer_workers import TokenizerWorkers, watch_exit
from handlers.core.errors import EngineUnavailable
from handlers.core.live import LiveRequests

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
ENDED_WAIT_S = 5.0  # for ended requests to unwind before the worker stops waiting
# A prefill's engine outlives its last leg by this much: the leg ends when the prefill's side of
# the KV transfer is done, but the decode may not have taken delivery yet (seen on SGLang: a
# prefill stopped at once left its decode with "Lost connection with prefill instance").
PREFILL_SETTLE_S = 2.0
# Attached processes (--tokenizer-worker-num) drain alongside the engine process, which waits for
# them this much longer than its own drain before it stops its engine under them.
DRAIN_MARGIN_S = ENDED_WAIT_S + 5.0
ENGINE_EXIT_WHILE_STOPPING = "an engine subprocess exited while the worker stops"


class StartupInterrupted(BaseException):
    """SIGTERM/SIGINT before the worker served: not an Exception, so no `except Exception` in
    an engine's model loading swallows it (as with KeyboardInterrupt)."""


def _interrupt(signum: int, _frame: Any) -> None:
    raise StartupInterrupted(signal.Signals(signum).name)


def interrupt_startup() -> None:
    """Until the event loop takes the signals over (SignalGuard.take), raise on them."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)


async def drain(serving: "asyncio.Future[Any]", live: LiveRequests, timeout: float) -> None:
    """Wait for the endpoint to finish its in-flight requests (the runtime's graceful drain),
    at most `timeout` s; then end the live ones, and stop waiting ENDED_WAIT_S later."""
    done, _ = await asyncio.wait({serving}, timeout=timeout)
    if done:
        return
    count = live.end_all(EngineUnavailable(
        f"the worker is shutting down and its drain time ({timeout:g} s) ran out"))
    logger.warning("drain time (%g s) ran out: ended %d engine request(s)", timeout, count)
    done, _ = await asyncio.wait({serving}, timeout=ENDED_WAIT_S)
    if not done:
        logger.error("requests still in flight %.0f s after they were ended; stopping anyway",
                     ENDED_WAIT_S)
        serving.cancel()


async def settle(live: LiveRequests, seconds: float = PREFILL_SETTLE_S) -> None:
    """Keep the engine up until `seconds` after the last request ended."""
    if live.last_end is None:
        return
    wait = live.last_end + seconds - time.monotonic()
    if wait > 0:
        logger.info("keeping the engine up %.1f s for the decodes of the last legs", wait)
        await asyncio.sleep(wait)


def take_sigquit(worker: Any) -> None:
    """Once the worker stops, an engine subprocess exiting is expected: the signal often reaches
    the worker's whole process group (a terminal's Ctrl-C, a group kill), and SGLang's scheduler
    and detokenizer have no handler for it. SGLang's watchdog reports their exit with a SIGQUIT
    whose handler SIGKILLs the worker mid-drain (exit -9); instead, end what the engine held (a
    503) and let the stop go on to exit 0."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, worker.orphan,
                                                  ENGINE_EXIT_WHILE_STOPPING)


class StopSignals:
    """Where SIGTERM/SIGINT go once the loop owns them: during startup they cancel it (the
    worker exits 0 having served nothing); once serving, to the worker's graceful stop, which
    first undoes a model registration still under way (components/worker/serving.py)."""

    def __init__(self, startup: "asyncio.Task[Any]", workers: TokenizerWorkers | None) -> None:
        self._startup = startup
        self._workers = workers
        self.worker: Any = None  # components.worker.serving.Worker, once it serves
        self.interrupted = False
        self.engine_lost = False
        self._stop: asyncio.Future[Any] | None = None

    def __call__(self) -> None:
        if self._workers is not None:
            self._workers.terminate()
        if self.worker is None:
            self.interrupted = True
            self._startup.cancel()
        elif self._stop is None:
            take_sigquit(self.worker)
            self._stop = asyncio.ensure_future(self.worker.stop())

    def engine_exited(self) -> None:
        """An attached process's engine process exited: end what it holds at once, and stop."""
        if self.worker is not None:
            self.worker.orphan()
        self()

    def engine_process_exited(self, pid: int, code: int | None) -> None:
        """The engine process this worker owns (--cpu-engine-process separate) exited under it:
        no request can be served any more, so stop as above, and exit non-zero (`engine_lost`)
        rather than go on serving with no engine."""
        logger.error("the CPU engine process %d exited (code %s) while the worker runs; "
                     "ending its requests and stopping", pid, code)
        self.engine_lost = True
        self.engine_exited()


def watch_engine_process(loop: asyncio.AbstractEventLoop, engine: Any,
                         signals: StopSignals) -> None:
    """--cpu-engine-process separate: stop (non-zero) as soon as the engine process exits under
    the worker (its pidfd: no polling); not when the worker's own shutdown stopped it."""
    proc = getattr(engine, "engine_process", None)
    if proc is None:
        return

    def exited() -> None:
        if not engine.closed:
            signals.engine_process_exited(proc.pid, proc.poll())

    watch_exit(loop, proc.pid, exited)
