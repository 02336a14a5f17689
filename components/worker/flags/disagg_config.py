"""1.6.1's `--disagg-config FILE --disagg-config-key KEY`: one section of a YAML file (e.g. the
`prefill` or `decode` settings of a deployment) used as SGLang's `--config` file, the command
line winning over it, as 1.6.1's worker does (its args.py writes the section to a temporary file
and merges it with SGLang's own `ConfigArgumentMerger`, which `--engine sglang` uses too)."""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Callable

import yaml

FLAGS = ("--disagg-config", "--disagg-config-key")


def _split(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--disagg-config", default=os.environ.get("DYN_SGL_DISAGG_CONFIG"))
    pre.add_argument("--disagg-config-key", default=os.environ.get("DYN_SGL_DISAGG_CONFIG_KEY"))
    return pre.parse_known_args(argv)


def _section(path: str, key: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"--disagg-config {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        keys = list(data) if isinstance(data, dict) else []
        raise SystemExit(f"--disagg-config-key {key!r}: no such section in {path} "
                         f"(sections: {keys})")
    return data[key]


def _without_config(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--config":
            skip = True
        elif not arg.startswith("--config="):
            out.append(arg)
    return out


def expand(argv: list[str], merge: Callable[[list[str]], list[str]]) -> list[str]:
    """`merge`: the engine's `--config` expansion. A section replaces any `--config` given."""
    ns, rest = _split(argv)
    if ns.disagg_config is None and ns.disagg_config_key is None:
        return merge(argv)
    if ns.disagg_config is None or ns.disagg_config_key is None:
        raise SystemExit("--disagg-config and --disagg-config-key must be given together")
    section = _section(ns.disagg_config, ns.disagg_config_key)
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="disagg_config_")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(section, f)
        merged = merge([*_without_config(rest), "--config", path])
    finally:
        os.unlink(path)
    if "--config" in merged:  # the engine has no --config (the CPU engine)
        raise SystemExit("--disagg-config needs --engine sglang: it is read as SGLang's --config "
                         "file, which the CPU engine does not take")
    return merged
