"""Exists only to start SGLang engines faster in tests: their subprocesses from a forkserver.

SGLang starts its scheduler and detokenizer with the `spawn` method: each is a fresh interpreter
that imports SGLang again, about 8 s of CPU each here, and the suite starts a few dozen SGLang
engines on 2 cores. With TEST_SGLANG_FORKSERVER=1 (the suite sets it; the benchmarks do not),
an engine starts them from a forkserver that imported both modules once. The processes run
SGLang's own code with the arguments SGLang passes, as under `spawn`.

One thing differs: a forkserver's child has the forkserver as its parent, while SGLang's
scheduler, detokenizer and watchdogs send their SIGQUIT ("a child failed") to
`psutil.Process().parent()`. In the forkserver's children that call answers the engine's process,
so the signal still reaches the engine, as under `spawn`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import types
from typing import Any

ENABLE_ENV = "TEST_SGLANG_FORKSERVER"
_ENGINE_PID_ENV = "TEST_SGLANG_ENGINE_PID"  # set by the engine; its forkserver inherits it
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
_PRELOAD = ["sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager"]


def patch_engine(module: types.ModuleType) -> None:
    """SGLang's launch sets `spawn` in `_set_envs_and_config`, before it starts any process."""
    set_envs = module._set_envs_and_config

    def set_envs_then_forkserver(server_args: Any) -> None:
        set_envs(server_args)
        os.environ[_ENGINE_PID_ENV] = str(os.getpid())
        multiprocessing.set_start_method("forkserver", force=True)
        multiprocessing.set_forkserver_preload(_PRELOAD)

    module._set_envs_and_config = set_envs_then_forkserver


def is_engines_forkserver() -> bool:
    """This process is the forkserver an engine started: its parent set the variable, and it
    runs multiprocessing's forkserver (not, say, a process the engine's worker started)."""
    engine_pid = os.environ.get(_ENGINE_PID_ENV, "")
    command = " ".join(getattr(sys, "orig_argv", ()))
    return (engine_pid.isdigit() and os.getppid() == int(engine_pid)
            and "multiprocessing.forkserver import main" in command)


def patch_psutil(module: types.ModuleType) -> None:
    """In the forkserver's children, `Process().parent()` of the process itself is the engine."""
    engine_pid, server_pid = int(os.environ[_ENGINE_PID_ENV]), os.getpid()
    parent = module.Process.parent

    def parent_as_under_spawn(self: Any) -> Any:
        if self.pid == os.getpid() != server_pid:
            return module.Process(engine_pid)
        return parent(self)

    module.Process.parent = parent_as_under_spawn
