"""The SGLang engine adapter: the only module in the project that imports `sglang`.

It is imported only when `--engine sglang` was chosen (CUDA + sglang present), or by tests that
check the launch scripts' flags against the real `ServerArgs` parser.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from sglang.srt.server_args import ServerArgs

from components.engine_limits import EngineLimits

logger = logging.getLogger(__name__)


def add_sglang_flags(parser: argparse.ArgumentParser) -> None:
    """Every SGLang server flag, spelled and validated by SGLang itself."""
    group = parser.add_argument_group("SGLang engine (see the SGLang documentation)")
    # ServerArgs.add_cli_args wants a parser; collect its actions there, then file them under
    # our group so --help shows them apart from the Dynamo flags (Dynamo's trick too).
    # _add_action also runs argparse's conflict check against our Dynamo flags.
    sglang_parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(sglang_parser)
    for action in sglang_parser._actions:
        if action.option_strings:
            group._add_action(action)


def server_args_from_namespace(ns: argparse.Namespace) -> ServerArgs:
    # The handlers expect disjoint output_ids/text segments; SGLang's default is cumulative
    # (Dynamo PR #7642: the old `stream_output` name silently stopped working).
    ns.incremental_streaming_output = True
    return ServerArgs.from_cli_args(ns)


def create_engine(server_args: ServerArgs) -> Any:
    import sglang as sgl

    return sgl.Engine(server_args=server_args)


def sglang_limits(engine: Any) -> EngineLimits:
    server_args = engine.server_args
    info = engine._scheduler_init_result.scheduler_infos[0]
    return EngineLimits(
        context_length=int(engine.tokenizer_manager.context_len),
        max_total_num_tokens=int(info["max_total_num_tokens"]),
        max_running_requests=info.get("max_running_requests") or server_args.max_running_requests,
        page_size=int(server_args.page_size or 1),
    )
