"""Tool-call and reasoning parser flags, as Dynamo 1.6.1's SGLang worker takes them.

- `--dyn-tool-call-parser` / `--dyn-reasoning-parser` (env `DYN_TOOL_CALL_PARSER` /
  `DYN_REASONING_PARSER`): Dynamo's parsers, run by the frontend on what it detokenizes (Tokens
  mode). Registration puts them in the model's runtime config; names are
  `dynamo._core.get_tool_parser_names()` / `get_reasoning_parser_names()`.
- `--tool-call-parser` / `--reasoning-parser`: SGLang's, run by the worker on the text it
  generates (Text mode; components/backends/sglang_parsers.py). `--engine sglang` takes them
  from SGLang's own ServerArgs; the CPU engine's flag set (cpu_flags.py) has them too.

Native and Dynamo tool-call parsers both build tool calls, so they are mutually exclusive
(1.6.1's `_validate_parser_flags`); the two reasoning parsers may be paired. Every name is
checked at startup: a wrong one stops the worker, naming the flag and the valid names.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Optional

from dynamo._core import get_reasoning_parser_names, get_tool_parser_names

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParserFlags:
    dyn_tool_call_parser: Optional[str] = None  # registered; the frontend parses (Tokens)
    dyn_reasoning_parser: Optional[str] = None
    tool_call_parser: Optional[str] = None  # SGLang's; the worker parses (Text)
    reasoning_parser: Optional[str] = None
    # SGLang's --constrained-json-disable-any-whitespace / --constrained-json-max-whitespace-cnt,
    # applied to the tool-call constraint's arguments as to any JSON schema.
    json_any_whitespace: bool = True
    json_max_whitespace_cnt: Optional[int] = None

    @property
    def native(self) -> bool:
        return self.tool_call_parser is not None or self.reasoning_parser is not None


def add_parser_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--dyn-tool-call-parser",
                       default=os.environ.get("DYN_TOOL_CALL_PARSER"),
                       help="Dynamo's tool call parser for the model, run by the frontend "
                            "(Tokens mode; env DYN_TOOL_CALL_PARSER)")
    group.add_argument("--dyn-reasoning-parser",
                       default=os.environ.get("DYN_REASONING_PARSER"),
                       help="Dynamo's reasoning parser for the model, run by the frontend "
                            "(Tokens mode; env DYN_REASONING_PARSER)")


def _check_dynamo_name(flag: str, value: Optional[str], names: list[str]) -> None:
    if value is not None and value not in names:
        raise SystemExit(f"{flag} {value!r} is not one of Dynamo's parsers: "
                         f"{', '.join(sorted(names))}")


def parser_flags(ns: argparse.Namespace, text_mode: bool) -> ParserFlags:
    """Checked parser names from the parsed flags (SystemExit naming the flag if wrong)."""
    flags = ParserFlags(
        dyn_tool_call_parser=ns.dyn_tool_call_parser or None,
        dyn_reasoning_parser=ns.dyn_reasoning_parser or None,
        tool_call_parser=getattr(ns, "tool_call_parser", None) or None,
        reasoning_parser=getattr(ns, "reasoning_parser", None) or None,
        json_any_whitespace=not getattr(ns, "constrained_json_disable_any_whitespace", False),
        json_max_whitespace_cnt=getattr(ns, "constrained_json_max_whitespace_cnt", None),
    )
    if flags.tool_call_parser and flags.dyn_tool_call_parser:
        raise SystemExit("Cannot use both --tool-call-parser and --dyn-tool-call-parser: both "
                         "build tool calls (SGLang's parser in the worker, Dynamo's in the "
                         "frontend); choose one")
    _check_dynamo_name("--dyn-tool-call-parser", flags.dyn_tool_call_parser,
                       list(get_tool_parser_names()))
    _check_dynamo_name("--dyn-reasoning-parser", flags.dyn_reasoning_parser,
                       list(get_reasoning_parser_names()))
    if flags.native:
        # Imports sglang (seconds): only when a native parser was asked for.
        from components.backends.sglang_parsers import check_parser_names

        check_parser_names(flags.tool_call_parser, flags.reasoning_parser)
        if not text_mode:
            logger.warning("--tool-call-parser / --reasoning-parser act on the text this "
                           "worker renders (Text mode); with --skip-tokenizer-init the frontend "
                           "parses, with --dyn-tool-call-parser / --dyn-reasoning-parser")
    return flags
