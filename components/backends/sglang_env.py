"""The environment SGLang reads while its engine starts and runs, set as Dynamo 1.6.1's own
SGLang worker sets it (`dynamo/sglang/args.py`, `dynamo/sglang/init_llm.py`), before
`sgl.Engine` is built (its scheduler processes inherit it), and one setting of this worker's
own (`_prefill_heartbeat`). Only `--engine sglang` calls this."""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

CUDA_COREDUMP_WAIT_ENV = "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS"
BLOCK_NONZERO_RANK_ENV = "SGLANG_BLOCK_NONZERO_RANK_CHILDREN"
HEARTBEAT_INTERVAL_ENV = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"
# SGLang's floor for the interval; it forgets a prefill after 2 missed heartbeats (its default).
HEARTBEAT_INTERVAL_S = "2"


def prepare_sglang_environment(server_args: Any) -> None:
    _no_coredump_wait(server_args)
    _prefill_heartbeat(server_args)
    if int(getattr(server_args, "node_rank", 0) or 0) >= 1:
        # Otherwise `sgl.Engine()` on a node other than the first blocks in its constructor
        # for the engine's whole life (SGLang's `Engine._launch_subprocesses`).
        os.environ[BLOCK_NONZERO_RANK_ENV] = "0"


def _no_coredump_wait(server_args: Any) -> None:
    """On SIGQUIT (a scheduler or detokenizer died) SGLang's TokenizerManager tries a CUDA
    user-triggered coredump and then sleeps this long (60 s by default) on the event loop,
    even when the trigger did nothing: the worker stays registered but answers nothing. An
    explicit value, CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 or --crash-dump-folder (SGLang then
    enables user-triggered coredumps) is left alone, as 1.6.1 does."""
    if CUDA_COREDUMP_WAIT_ENV in os.environ:
        return
    if os.environ.get("CUDA_ENABLE_USER_TRIGGERED_COREDUMP") == "1":
        return
    if getattr(server_args, "crash_dump_folder", None):
        return
    os.environ[CUDA_COREDUMP_WAIT_ENV] = "0"
    logger.info("CUDA user-triggered coredumps are off: %s=0", CUDA_COREDUMP_WAIT_ENV)


def _prefill_heartbeat(server_args: Any) -> None:
    """A decode's SGLang keeps each prefill's ZMQ address and its own NIXL registration per
    bootstrap address, and forgets them only after missing that prefill's heartbeat twice
    (every 5 s by default). A prefill restarted at the same address (a restarted pod) before
    then meets the stale state: every request to it waits out its transfer and fails
    (measured between two hosts: a prefill back 7 s after its SIGKILL was never served).
    Every 2 s (SGLang's floor) a dead prefill is forgotten ~4 s after its death, before a new
    SGLang process can start its bootstrap server. An explicit value is left alone."""
    if getattr(server_args, "disaggregation_mode", "null") != "decode":
        return
    if HEARTBEAT_INTERVAL_ENV in os.environ:
        return
    os.environ[HEARTBEAT_INTERVAL_ENV] = HEARTBEAT_INTERVAL_S
    logger.info("prefill heartbeat every %s s: %s=%s", HEARTBEAT_INTERVAL_S,
                HEARTBEAT_INTERVAL_ENV, HEARTBEAT_INTERVAL_S)
