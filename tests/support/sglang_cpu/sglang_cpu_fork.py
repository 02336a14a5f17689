"""Exists only to start SGLang engines faster in tests: their subprocesses are forked.

SGLang starts its scheduler and detokenizer with the `spawn` method: each is a fresh interpreter
that imports SGLang again, about 5-8 s of CPU each here, and the suite starts dozens of SGLang
engines on 2 cores. With TEST_SGLANG_FORK=1 (the suite sets it; the benchmarks do not), an
engine forks them from its own process, which has imported SGLang already (on CPU nothing is
lost: `spawn` is there for CUDA, which a forked process cannot use). The processes run SGLang's
own code with the arguments SGLang passes, as under `spawn`, and their parent is the engine's
process, where SGLang's scheduler, detokenizer and watchdogs send their SIGQUIT.

A stop signal is held off (blocked) while the engine's process forks: Python runs its at-fork
hooks there (logging's, for one), and an exception a signal handler raises inside one is printed
and dropped, so a worker's SIGTERM during its engine's load would be lost; under `spawn` no
Python runs in the parent's fork. Unblocked, it is handled as soon as the fork returns.

Two things a fork would otherwise change, so each forked child is put back as a spawned one
first:
- the signal handling: the child would inherit the worker's (its event loop's handlers, which
  only wake that loop, and the loop's wakeup descriptor). With the defaults, a SIGTERM to the
  worker's process group ends SGLang's processes as under `spawn`, and a signal to a child never
  wakes the worker's loop;
- `prometheus_client`'s value class, which it picks when imported: the worker imported it before
  SGLang set PROMETHEUS_MULTIPROC_DIR (with --enable-metrics), and a scheduler keeping its
  metrics in its own memory instead of the shared directory reports nothing to the worker.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.popen_fork
import multiprocessing.util
import signal
import sys
import types
from typing import Any

ENABLE_ENV = "TEST_SGLANG_FORK"
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def patch_engine(module: types.ModuleType) -> None:
    """SGLang's launch sets `spawn` in `_set_envs_and_config`, before it starts any process."""
    set_envs = module._set_envs_and_config

    def set_envs_then_fork(server_args: Any) -> None:
        set_envs(server_args)
        multiprocessing.set_start_method("fork", force=True)
        # Run in each of multiprocessing's children, right after the fork. The registry holds
        # its key weakly: the key is the function itself, which its module keeps.
        multiprocessing.util.register_after_fork(as_if_spawned, as_if_spawned)

    module._set_envs_and_config = set_envs_then_fork
    launch = multiprocessing.popen_fork.Popen._launch
    if getattr(launch, "holds_stop_signals", False):
        return

    def launch_holding_stop_signals(self: Any, process_obj: Any) -> None:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            launch(self, process_obj)  # the child never returns from it (as_if_spawned unblocks)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    launch_holding_stop_signals.holds_stop_signals = True  # type: ignore[attr-defined]
    multiprocessing.popen_fork.Popen._launch = launch_holding_stop_signals


def as_if_spawned(_: object = None) -> None:
    """A forked child as a spawned interpreter: every signal handler Python set back to the
    default (SIGINT to Python's KeyboardInterrupt), the stop signals unblocked, no wakeup
    descriptor, and prometheus_client's value class chosen from the environment SGLang set."""
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        values.ValueClass = values.get_value_class()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):  # a signal Python cannot inspect (SIGKILL, SIGSTOP, ...)
            continue
        if callable(handler):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
