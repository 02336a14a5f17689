"""The SGLang engine adapter: the only module in the project that imports `sglang`.

It is imported only when `--engine sglang` was chosen (CUDA + sglang present, or SGLang's own CPU
path with `SGLANG_USE_CPU_ENGINE=1`), or by tests that check the launch scripts' flags against the
real `ServerArgs` parser.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from sglang.srt.arg_groups.model_override_base import resolved_view
from sglang.srt.server_args import ServerArgs

from components.backends.sglang import dp_layout
from components.backends.sglang_aborts import aborts_are_ordered, order_aborts
from components.backends.sglang_choices import RoomPerChoice
from components.backends.sglang_env import prepare_sglang_environment
from components.backends.sglang_compat import (
    adopt_flags, sglang_adapt_tokenizer_manager, sglang_end_request, sglang_scheduler_info,
)
from components.backends.limits import EngineLimits, sglang_on_cpu
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST  # SGLang's own value: no KV moves

logger = logging.getLogger(__name__)

# SGLang's CPU path sizes the KV pool from free memory and warns when it is smaller than the
# context; without a GPU the pool is sized explicitly unless --max-total-tokens says otherwise.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 4096
PREFILL_WARMUP_TIMEOUT_S = 1800.0  # Dynamo 1.6.1's (dynamo/sglang/_disagg.py)


def add_sglang_flags(parser: argparse.ArgumentParser) -> None:
    """Every SGLang server flag, spelled and validated by SGLang itself."""
    group = parser.add_argument_group("SGLang engine (see the SGLang documentation)")
    # ServerArgs.add_cli_args wants a parser; collect its actions there, then file them under
    # our group so --help shows them apart from the Dynamo flags (Dynamo's trick too).
    # _add_action also runs argparse's conflict check against our Dynamo flags.
    sglang_parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(sglang_parser)
    _add_legacy_flags(sglang_parser)
    adopt_flags(sglang_parser, group)


def _add_legacy_flags(parser: argparse.ArgumentParser) -> None:
    """Dynamo 1.6.1's worker keeps SGLang 0.5.19's `--disable-piecewise-cuda-graph` for its
    launch scripts (its `add_sglang_cli_compat`), meaning `--cuda-graph-backend-prefill
    disabled`; the same here, so those lines start this worker too."""
    try:
        parser.add_argument("--disable-piecewise-cuda-graph", dest="cuda_graph_backend_prefill",
                            action="store_const", const="disabled", default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    except argparse.ArgumentError:  # an SGLang that still has it
        pass


def merge_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Expand `--config FILE.yaml` into flags the way `sglang serve` does (the command line wins
    over the file); argparse alone would parse the path and drop the file's settings."""
    argv = _split_equals(argv, "--config")
    if "--config" not in argv:
        return argv
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    try:
        return ConfigArgumentMerger(parser).merge_config_with_args(argv)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--config: {exc}") from None


def _split_equals(argv: list[str], flag: str) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if arg.startswith(flag + "="):
            out += [flag, arg[len(flag) + 1:]]
        else:
            out.append(arg)
    return out


def apply_cpu_settings(ns: argparse.Namespace) -> None:
    """SGLang's own CPU path (`SGLANG_USE_CPU_ENGINE=1`): CPU device, torch-native attention, no
    CUDA graphs, float32 unless a dtype was asked for, an explicitly sized KV pool, and no decode
    retraction backup (its host pool calls into CUDA)."""
    ns.device = "cpu"
    ns.attention_backend = ns.attention_backend or "torch_native"
    ns.disable_cuda_graph = True
    if ns.dtype == "auto":
        ns.dtype = "float32"
    if ns.max_total_tokens is None:
        ns.max_total_tokens = CPU_DEFAULT_MAX_TOTAL_TOKENS
    if ns.disaggregation_mode == "decode" and ns.disaggregation_decode_retraction_backup is None:
        ns.disaggregation_decode_retraction_backup = "none"


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    ns = argparse.Namespace(**vars(ns))  # the worker's own flags stay as the user gave them
    # The handlers expect disjoint output_ids/text segments; SGLang's default is cumulative
    # (Dynamo PR #7642: the old `stream_output` name silently stopped working).
    ns.incremental_streaming_output = True
    ns.skip_tokenizer_init = engine_skips_tokenizer(ns)
    if sglang_on_cpu():
        apply_cpu_settings(ns)
    return ServerArgs.from_cli_args(ns)


def engine_skips_tokenizer(ns: argparse.Namespace) -> bool:
    """Whether SGLang itself runs without a tokenizer. In Tokens mode (`--skip-tokenizer-init`:
    token ids in and out, the frontend tokenizes) SGLang still loads its tokenizer while its
    grammar backend is on: SGLang 0.5.23 builds that backend (structured output, and the guided
    decoding the frontend makes of a forced `tool_choice`) from the tokenizer, and none without
    one. Dynamo 1.6.1's worker runs the same way on a line without `--skip-tokenizer-init`.
    `--grammar-backend none` gives the engine without a tokenizer (no detokenizing per token)."""
    return bool(ns.skip_tokenizer_init) and ns.grammar_backend == "none"


def create_engine(server_args: ServerArgs) -> Any:
    import sglang as sgl

    prepare_sglang_environment(server_args)
    engine = sgl.Engine(server_args=server_args)
    if engine.tokenizer_manager is not None:  # None on a node other than the first
        order_aborts(engine.tokenizer_manager)
        sglang_adapt_tokenizer_manager(engine.tokenizer_manager)
    return room_per_choice(engine)


def attach_engine(parent_pid: int) -> Any:
    """SGLang's Engine.attach_tokenizer_worker: a TokenizerWorker in this process registered
    with the router of the Engine in `parent_pid` (started with tokenizer_worker_num > 1)."""
    import sglang as sgl

    engine = sgl.Engine.attach_tokenizer_worker(parent_pid)
    order_aborts(engine.tokenizer_manager)
    sglang_adapt_tokenizer_manager(engine.tokenizer_manager)
    return room_per_choice(engine)


def room_per_choice(engine: Any) -> Any:
    """A disaggregated engine serves n > 1 one room per choice (`sglang_choices.py`)."""
    server_args = getattr(engine, "server_args", None)  # an attached worker's may lack it
    mode = str(getattr(server_args, "disaggregation_mode", "null") or "null")
    if mode not in ("prefill", "decode"):
        return engine
    return RoomPerChoice(engine, prefill=mode == "prefill")


def abort_process_requests(engine: Any, prefix: str) -> None:
    """Abort every request whose rid starts with `prefix` (one attached process's, gone): in
    multi-tokenizer mode SGLang sends an abort of a rid it does not hold to its scheduler, which
    matches rids by prefix in every queue."""
    engine.tokenizer_manager.abort_request(rid=prefix)


def end_orphaned_requests(engine: Any, message: str) -> int:
    """An attached process whose engine process died: end each request it holds as SGLang ends
    one its scheduler aborted (a 503 abort), since no output will ever come for them."""
    manager = engine.tokenizer_manager
    rids = list(manager.rid_to_state)
    for rid in rids:
        sglang_end_request(manager, rid, {"type": "abort", "message": message,
                                          "status_code": 503})
    return len(rids)


def resolved_server_args(engine: Any) -> Any:
    """What the engine really runs with: SGLang keeps `ServerArgs` as given and records what it
    resolved (page size forced by the attention backend, context length, ...) on the side."""
    return resolved_view(engine.server_args)


def sglang_limits(engine: Any) -> EngineLimits:
    resolved = resolved_server_args(engine)
    info = sglang_scheduler_info(engine)
    manager = engine.tokenizer_manager
    return EngineLimits(
        context_length=int(manager.context_len),
        max_total_num_tokens=int(info["max_total_num_tokens"]),
        max_running_requests=info.get("max_running_requests") or resolved.max_running_requests,
        page_size=int(resolved.page_size or 1),
        # Speculative decoding keeps draft tokens in the request's context budget.
        reserved_tokens=int(getattr(manager, "num_reserved_tokens", 0) or 0),
        cancel_anytime=aborts_are_ordered(manager),
        # Dynamo 1.6.1's rule (capacity.runtime_capacity): --max-prefill-tokens, else the pool.
        max_num_batched_tokens=int(resolved.max_prefill_tokens
                                   or info["max_total_num_tokens"]),
        # Every DP rank, attention-DP ones included (components/backends/sglang.py dp_layout).
        dp_size=dp_layout(resolved)[0],
        dcp_size=int(getattr(resolved, "dcp_size", 1) or 1),
        enable_eagle=eagle_enabled(resolved.speculative_algorithm),
    )


def eagle_enabled(speculative_algorithm: str | None) -> bool:
    """SGLang's own predicate (`SpeculativeAlgorithm.is_eagle`: EAGLE, EAGLE3 and the other
    variants its radix cache keys by bigrams), as Dynamo 1.6.1's `_eagle_enabled_for`."""
    if not speculative_algorithm:
        return False
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        return bool(SpeculativeAlgorithm.from_string(speculative_algorithm).is_eagle())
    except (KeyError, ValueError) as exc:
        raise SystemExit(f"--speculative-algorithm {speculative_algorithm!r}: {exc}") from None


def local_ip() -> str:
    """This machine's address as SGLang's own bootstrap advertises it (`SGLANG_HOST_IP` wins)."""
    from sglang.srt.utils.network import get_local_ip_auto

    return get_local_ip_auto()


async def warmup_prefill(engine: Any, bootstrap_port: int, dp_size: int = 1) -> None:
    """One request per DP rank through the prefill path before serving, concurrently (SGLang's
    fake bootstrap host: no decode peer), so the first real request on any rank does not pay
    for compilation and allocation; as Dynamo 1.6.1's `_disagg.warmup_prefill_engine`, with
    its bound (sized for a large model with a cold JIT cache)."""
    async def run(rank: int) -> None:
        stream = await engine.async_generate(
            input_ids=[10, 11, 12, 13],
            sampling_params={"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
            stream=True, bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=bootstrap_port,
            bootstrap_room=rank, routed_dp_rank=rank,
        )
        async for _ in stream:
            pass

    logger.info("prefill warmup starting (%d DP rank(s))", dp_size)
    await asyncio.wait_for(asyncio.gather(*(run(rank) for rank in range(dp_size))),
                           PREFILL_WARMUP_TIMEOUT_S)
    logger.info("prefill warmup complete")
