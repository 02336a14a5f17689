"""Dynamo 1.6.1's own worker flags: what `python -m dynamo.sglang --help` lists beyond SGLang's
`ServerArgs`, so a 1.6.1 launch line starts this worker unchanged.

Each such flag is accepted with 1.6.1's meaning (parsed here, or by `config.py` where this worker
had it already), or refused at startup with a message naming it and saying why; a refused
boolean's `--no-` form (1.6.1's default) is accepted. docs/compatibility.md ("Launch line") lists
every disposition; tests/unit/worker/test_dynamo_flags.py checks each flag of 1.6.1's parser is
in one of them. SGLang's own flags are the engine's (components/backends/).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from dynamo.common.configuration.groups.router_args import (
    parse_worker_router_config,
    register_worker_router_help,
)
from dynamo.common.configuration.utils import split_served_model_names

from components.worker.flags.dynamo_flag_table import (
    DEFAULT_ENDPOINT_TYPES,
    ENV_FLAGS,
    ENV_SWITCHES,
    IGNORED,
    NOT_TEXT_LLM,
    REFUSED_SWITCHES,
    REFUSED_VALUES,
    STRUCTURAL_TAG_OFF,
)


@dataclass(frozen=True)
class LaunchArgs:
    """The 1.6.1 flags that change what this worker registers or how its runtime starts."""
    model_aliases: tuple[str, ...] = ()
    custom_jinja_template: Optional[str] = None
    endpoint_types: str = DEFAULT_ENDPOINT_TYPES
    dump_config_to: Optional[str] = None
    event_plane: Optional[str] = None
    response_plane: str = "tcp"
    exclude_tools_when_tool_choice_none: bool = True
    # Dynamo's WorkerRouterConfig: routing this worker set advertises (--router-mode ...)
    router: Any = field(default=None, compare=False, repr=False)


class _Refuse(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, reason: str = "",
                 neutral: tuple = (), **kwargs: Any) -> None:
        self.reason, self.neutral = reason, neutral
        super().__init__(option_strings, dest, default=argparse.SUPPRESS,
                         help=f"Dynamo 1.6.1 flag, refused: {reason}", **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if self.nargs != 0 and values in self.neutral:
            return
        raise SystemExit(f"{option_string} is not supported by this worker: {self.reason} "
                         "(docs/compatibility.md, 'Launch line')")


def _env(name: str, default: Any) -> Any:
    return os.environ.get(name, default)


def add_dynamo_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Dynamo 1.6.1 worker flags (python -m dynamo.sglang)")
    g.add_argument("--namespace", default=_env("DYN_NAMESPACE", "dynamo"),
                   help="Dynamo namespace of the default endpoints (env DYN_NAMESPACE; "
                        "DYN_NAMESPACE_WORKER_SUFFIX is appended as in 1.6.1)")
    g.add_argument("--custom-jinja-template", default=_env("DYN_CUSTOM_JINJA_TEMPLATE", None),
                   help="chat template file that overrides the model's; the frontend applies it "
                        "(Tokens mode: --skip-tokenizer-init)")
    g.add_argument("--endpoint-types", "--dyn-endpoint-types",
                   default=_env("DYN_ENDPOINT_TYPES", DEFAULT_ENDPOINT_TYPES),
                   help="chat, completions, chat,completions or none (Text mode: chat only)")
    g.add_argument("--dump-config-to", default=_env("DYN_DUMP_CONFIG_TO", None),
                   help="write the resolved configuration to this file at startup (JSON)")
    g.add_argument("--use-sglang-tokenizer", action=argparse.BooleanOptionalAction,
                   default=False, help="1.6.1's Text mode: the worker tokenizes and renders the "
                                       "chat template (this worker's mode without "
                                       "--skip-tokenizer-init)")
    g.add_argument("--gateway-workers", type=int, default=None,
                   help="1.6.1's name for --tokenizer-worker-num N (N processes on one engine)")
    # Read (and removed from the command line) before parsing: disagg_config.py.
    g.add_argument("--disagg-config", help="YAML file whose --disagg-config-key section is "
                                           "SGLang's --config (--engine sglang)")
    g.add_argument("--disagg-config-key", help="the section of --disagg-config, e.g. prefill")
    g.add_argument("--event-plane", choices=["nats", "zmq"], default=_env("DYN_EVENT_PLANE", None))
    g.add_argument("--response-plane", choices=["tcp", "quic"],
                   default=_env("DYN_RESPONSE_PLANE", "tcp"))
    g.add_argument("--version", action="version", version="Dynamo-compatible worker "
                   "(python -m components) for Dynamo 1.6.1")
    for flag, env in ENV_FLAGS.items():
        g.add_argument(flag, default=None, help=f"sets {env} for Dynamo's runtime, as 1.6.1 does")
    for flag, env in ENV_SWITCHES.items():
        g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                       help=f"sets {env}=1 for Dynamo's runtime, as 1.6.1 does")
    g.add_argument("--exclude-tools-when-tool-choice-none", action=argparse.BooleanOptionalAction,
                   default=True, help="the frontend drops tools from the chat template when "
                                      "tool_choice is none (advertised on the model card)")
    g.add_argument("--output-modalities", nargs="*", default=["text"], help="text only")
    for flag in IGNORED:
        g.add_argument(flag, nargs="*", default=None, help="accepted; unused by 1.6.1's LLM worker")
    _add_refused(g)
    register_worker_router_help(parser)


def _add_refused(g: argparse._ArgumentGroup) -> None:
    for flag, reason in REFUSED_SWITCHES.items():
        try:
            g.add_argument(flag, action=_Refuse, nargs=0, reason=reason)
        except argparse.ArgumentError:  # SGLang's own (--enable-multimodal): checked when parsed
            pass
        g.add_argument("--no-" + flag[2:], action="store_false", dest=flag[2:].replace("-", "_"),
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    for flag, (neutral, reason) in REFUSED_VALUES.items():
        g.add_argument(flag, action=_Refuse, reason=reason, neutral=(neutral,))
    g.add_argument("--dyn-structural-tag", action=_Refuse, nargs="?", const="true",
                   reason=REFUSED_SWITCHES["--dyn-enable-structural-tag"],
                   neutral=STRUCTURAL_TAG_OFF)


def split_router_flags(argv: list[str]) -> tuple[Any, list[str]]:
    """1.6.1's router advertisement flags (`--router-mode`, `--router-kv-overlap-score-weight`,
    ...), parsed by Dynamo's own parser as 1.6.1 does, before the worker's parser sees the rest."""
    return parse_worker_router_config(argv)


def served_names(value: Optional[str], model_path: str) -> tuple[str, tuple[str, ...]]:
    """`--served-model-name "a b,c"`: 1.6.1 serves `a` and registers `b`, `c` as its aliases."""
    names = split_served_model_names(value)
    return (names[0], tuple(names[1:])) if names else (model_path, ())


def apply_gateway_workers(ns: argparse.Namespace) -> None:
    """`--gateway-workers N` is 1.6.1's `--tokenizer-worker-num N`; both given must agree."""
    n = ns.gateway_workers
    if n is None:
        return
    if n < 1:
        raise SystemExit(f"--gateway-workers must be a positive integer, got {n}")
    given = getattr(ns, "tokenizer_worker_num", None)
    if given not in (None, 1, n):
        raise SystemExit(f"--gateway-workers {n} and --tokenizer-worker-num {given} disagree")
    ns.tokenizer_worker_num = n


def launch_args(ns: argparse.Namespace, text_mode: bool, aliases: tuple[str, ...],
                router: Any) -> LaunchArgs:
    """Check the 1.6.1 flags against each other and the role; export the runtime's variables."""
    if ns.use_sglang_tokenizer and not text_mode:
        raise SystemExit("--use-sglang-tokenizer (Text mode) contradicts --skip-tokenizer-init")
    if getattr(ns, "schedule_low_priority_values_first", False):  # SGLang's; 1.6.1 refuses it
        raise SystemExit("--schedule-low-priority-values-first is not supported: as in Dynamo "
                         "1.6.1, a higher routing.priority is always the higher priority")
    if getattr(ns, "enable_multimodal", None):  # SGLang's flag too, on --engine sglang
        raise SystemExit(f"--enable-multimodal is not supported by this worker: {NOT_TEXT_LLM}")
    if ns.output_modalities not in (["text"], []):
        raise SystemExit(f"--output-modalities {' '.join(ns.output_modalities)}: text only; "
                         + NOT_TEXT_LLM)
    _check_endpoint_types(ns.endpoint_types, text_mode)
    _export_env(ns)
    return LaunchArgs(model_aliases=aliases,
                      custom_jinja_template=_template(ns.custom_jinja_template, text_mode),
                      endpoint_types=ns.endpoint_types, dump_config_to=ns.dump_config_to,
                      event_plane=ns.event_plane, response_plane=ns.response_plane,
                      exclude_tools_when_tool_choice_none=ns.exclude_tools_when_tool_choice_none,
                      router=router)


def _template(path: Optional[str], text_mode: bool) -> Optional[str]:
    if path is None:
        return None
    if text_mode:  # 1.6.1 refuses it with --use-sglang-tokenizer, its Text mode, too
        raise SystemExit("--custom-jinja-template needs --skip-tokenizer-init: the frontend "
                         "applies it; in Text mode this worker renders the model's template")
    expanded = os.path.expandvars(os.path.expanduser(path))
    if not os.path.isfile(expanded):
        raise SystemExit(f"--custom-jinja-template: file not found: {expanded}")
    return expanded


def _check_endpoint_types(value: str, text_mode: bool) -> None:
    from dynamo.common.utils.endpoint_types import parse_endpoint_types

    try:
        parse_endpoint_types(value)
    except ValueError as exc:
        raise SystemExit(f"--endpoint-types {value!r}: {exc}") from None
    types = {t.strip().lower() for t in value.split(",") if t.strip()}
    if text_mode and types == {"completions"}:
        raise SystemExit("--endpoint-types completions needs --skip-tokenizer-init: a Text-mode "
                         "worker serves chat completions only")


def _export_env(ns: argparse.Namespace) -> None:
    for flag, env in ENV_FLAGS.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is not None:
            os.environ[env] = str(value)
    for flag, env in ENV_SWITCHES.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value:
            os.environ[env] = "1"
        elif value is False:
            os.environ.pop(env, None)
    os.environ["DYN_RESPONSE_PLANE"] = ns.response_plane


def worker_namespace(value: str) -> str:
    """1.6.1's namespace: `--namespace` plus `-$DYN_NAMESPACE_WORKER_SUFFIX` when set."""
    from dynamo.common.utils.namespace import get_worker_namespace

    return get_worker_namespace(value)


def refuse_unknown(unknown: list[str], engine: str) -> None:
    """Flags neither Dynamo's nor this engine's: name them, and say where the full set is."""
    if not unknown:
        return
    flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")] or unknown
    raise SystemExit(f"unrecognized arguments: {' '.join(flags)}: not flags of this worker on "
                     f"the {engine} engine (the CPU engine takes the SGLang flags its --help "
                     "lists; --engine sglang takes all of SGLang's)")
