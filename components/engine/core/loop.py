"""The engine thread: owns the model, the KV pool, the scheduler and the KV transport (built
on this thread by build.py).

ALL torch work, model load included, runs on this one thread: libgomp throttles a process
whose torch ops have run on more than one OS thread. Other threads only enqueue commands;
results leave through the LoopBatcher. When idle the thread blocks on its command queue
(with a short periodic wake in disaggregated mode, so the transport's side channel progresses).

One step: ``scheduler.schedule() -> runner.forward(batch) -> processor.postprocess(batch,
logits) -> scheduler.update(outcomes)``, then the step's chunks go out in one flush.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from typing import Any

from components.engine.config import EngineConfig
from components.engine.core.build import EngineInfo, build_parts
from components.engine.core.actions import Coordinator, MakeCoordinator
from components.engine.core.commands import AbortRequest, AddRequest, Command, SetListener, Stop
from components.engine.kv.events import KvEventListener
from components.engine.kv.pool import KVPool
from components.engine.kv.prefix_cache import PrefixCache
from components.engine.core.loop_batcher import LoopBatcher
from components.engine.core.runner import ModelRunner
from components.engine.core.processor import OutputProcessor, finish_abort
from components.engine.core.scheduler import Scheduler
from components.engine.core.sequence import Sequence

logger = logging.getLogger(__name__)

IDLE_WAKE_S = 0.05   # disaggregated & idle: service the side channel this often
PEER_POLL_S = 0.002  # waiting on a peer with nothing to compute: transport poll slice
STARTUP_TIMEOUT_S = 600.0
_PR_SET_NAME = 15  # linux/prctl.h


def _name_os_thread(name: str) -> None:
    """Give the OS thread the Python thread's name (Python 3.11 does not), so per-thread tools
    (`top -H`, /proc/<pid>/task/*/comm, benchmarks/thread_cpu.py) can tell the engine apart."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name is only a convenience
        pass


class EngineLoop:
    def __init__(self, cfg: EngineConfig, batcher: LoopBatcher,
                 make_coordinator: MakeCoordinator) -> None:
        self.cfg = cfg
        self._batcher = batcher
        self._make_coordinator = make_coordinator  # disagg/ sits above core: handed in
        self._cmds: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="cpu-engine", daemon=True)
        self.info: EngineInfo | None = None
        # The parts (build.py), set on the engine thread by _setup. A step drives the first
        # three; the rest serve the idle policy and other threads' read-outs.
        self._sched: Scheduler | None = None
        self._runner: ModelRunner | None = None
        self._processor: OutputProcessor | None = None
        self._pool: KVPool | None = None
        self._cache: PrefixCache | None = None
        self._disagg: Coordinator | None = None
        self._listener: KvEventListener | None = None  # engine thread only
        self._last_load: tuple[int, int, int] | None = None

    # ---- called from other threads ----------------------------------------------------------
    def start(self) -> EngineInfo:
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT_S):
            raise RuntimeError(f"CPU engine did not start within {STARTUP_TIMEOUT_S:.0f} s")
        if self._startup_error is not None:
            err = self._startup_error
            raise RuntimeError(f"CPU engine failed to start: {err}") from err
        assert self.info is not None
        return self.info

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, seq: Sequence) -> None:
        self._cmds.put(AddRequest(seq))

    def abort(self, rid: str, abort_all: bool) -> None:
        self._cmds.put(AbortRequest(rid, abort_all))

    def set_kv_event_listener(self, listener: KvEventListener) -> None:
        self._cmds.put(SetListener(listener))

    def stop(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._cmds.put(Stop())
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.error("CPU engine thread did not stop within %.0f s", timeout)

    def pages_in_use(self) -> int:
        """Pages held by requests (and by a peer's transfer), not by the prefix cache."""
        pool = self._pool
        return pool.pages_in_use - self.cached_pages() if pool is not None else 0

    def queue_depth(self) -> int:
        """Requests waiting for admission (a deque's len is safe from another thread)."""
        return len(self._sched.waiting) if self._sched is not None else 0

    def kv_transfer_totals(self) -> Any:
        """Prefill mode: the transport's completed-WRITE totals; otherwise None."""
        disagg = self._disagg
        return disagg.transfer_totals if disagg is not None else None

    def cached_pages(self) -> int:
        cache = self._cache
        return cache.pages if cache is not None else 0

    def prefix_hit_tokens(self) -> int:
        cache = self._cache
        return cache.hit_tokens if cache is not None else 0

    # ---- the thread -------------------------------------------------------------------------
    def _main(self) -> None:
        _name_os_thread(self._thread.name)
        try:
            self._setup()
        except BaseException as exc:  # reported to the constructor, which raises it
            logger.exception("CPU engine startup failed")
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._run()
        except BaseException:
            logger.exception("CPU engine thread crashed")
            raise
        finally:
            self._teardown()

    def _setup(self) -> None:
        parts = build_parts(self.cfg, self._make_coordinator)
        self._sched, self._runner, self._processor = parts.sched, parts.runner, parts.processor
        self._pool, self._cache = parts.pool, parts.cache
        self._disagg = parts.disagg
        self.info = info = parts.info
        logger.info("CPU engine ready: mode=%s context=%d pool=%d tokens",
                    self.cfg.disaggregation_mode, info.context_length, info.max_total_num_tokens)

    def _run(self) -> None:
        sched, disagg = self._sched, self._disagg
        while True:
            busy = sched.has_compute_work()
            if disagg is None:
                timeout = 0.0 if busy else None
            elif busy or disagg.has_pending():
                timeout = 0.0
            else:
                timeout = IDLE_WAKE_S
            if not self._drain(timeout):
                return
            try:
                if disagg is not None:
                    sched.poll_peer(PEER_POLL_S if not busy and disagg.has_pending() else 0.0)
                    self._batcher.flush()  # the first token that came with the KV goes out now
                self._step()
            except Exception as exc:  # a failed step must not leave requests hanging
                logger.exception("engine step failed")
                sched.abort_everything(f"Internal CPU engine error: {exc}", 500)
            if self._listener is not None:  # before the flush: a caller that saw its request
                self._report_load()         # end sees the load without it
            self._batcher.flush()

    def _report_load(self) -> None:
        """Tell the listener the load when it changed (a router's view of this worker)."""
        sched = self._sched
        load = (self.pages_in_use(), len(sched.running), len(sched.waiting))
        if load != self._last_load:
            self._last_load = load
            self._listener.load(*load)

    def _step(self) -> None:
        batch = self._sched.schedule()
        if not batch:
            return
        t0 = time.perf_counter()
        logits = self._runner.forward(batch)
        if batch.prefill and logger.isEnabledFor(logging.DEBUG):
            ms = (time.perf_counter() - t0) * 1e3  # benchmarks read these records
            for chunk in batch.prefill:
                if chunk.completes_prompt:
                    logger.debug("prefill rid=%s %d tokens in %.1f ms", chunk.seq.rid,
                                 chunk.seq.prompt_len, ms)
        self._sched.update(self._processor.postprocess(batch, logits))

    def _drain(self, timeout: float | None) -> bool:
        """Apply queued commands; block up to ``timeout`` for the first. False on stop."""
        try:
            cmd = self._cmds.get(timeout=timeout) if timeout != 0.0 else self._cmds.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, Stop):
                return False
            self._apply(cmd)
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                self._batcher.flush()  # rejections and aborts go out before the next forward
                return True

    def _apply(self, cmd: Command) -> None:
        try:
            match cmd:
                case AddRequest(seq):
                    self._sched.add(seq)
                case AbortRequest(rid, abort_all):
                    self._sched.abort(rid, abort_all)
                case SetListener(listener):
                    self._listener = listener
                    if self._cache is not None:
                        self._cache.listener = listener
        except Exception as exc:  # one bad command must not stop the engine thread
            logger.exception("engine command %s failed", type(cmd).__name__)
            match cmd:
                case AddRequest(seq):  # its caller still waits for the request's end
                    self._sched.finish(seq, finish_abort(f"Internal CPU engine error: {exc}", 500))

    def _teardown(self) -> None:
        if self._sched is not None:
            while True:  # requests still queued behind the stop command end like the rest
                try:
                    cmd = self._cmds.get_nowait()
                except queue.Empty:
                    break
                match cmd:
                    case AddRequest(seq):
                        self._sched.add(seq)
            self._sched.close()
            self._batcher.flush()
        logger.info("CPU engine thread stopped")
