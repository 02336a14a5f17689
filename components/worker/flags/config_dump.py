"""`--dump-config-to FILE` (Dynamo 1.6.1's flag): the resolved configuration, written at startup
by Dynamo's own dumper (system info, environment, package versions around it), as 1.6.1's
worker writes its own."""

from __future__ import annotations

import dataclasses
from typing import Any

from dynamo.common.config_dump import dump_config, register_encoder

from components.worker.flags.config import WorkerConfig


@register_encoder(WorkerConfig)
def _encode(config: WorkerConfig) -> dict[str, Any]:
    # The engine's arguments are a read-only mapping (CPU engine) or SGLang's ServerArgs;
    # the backend and the router advertisement are objects, named rather than walked.
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name not in ("backend", "engine_args", "role", "launch")}
    engine_args = config.engine_args
    return {
        **fields,
        "engine": config.backend.name,
        "role": {"mode": config.role.mode.value, "orchestrator": config.role.orchestrator.value,
                 "skip_tokenizer_init": config.role.skip_tokenizer_init},
        "launch": {**{f.name: getattr(config.launch, f.name)
                      for f in dataclasses.fields(config.launch) if f.name != "router"},
                   "router": repr(config.launch.router)},
        "engine_args": _redacted(dict(engine_args) if hasattr(engine_args, "keys")
                                 else vars(engine_args)),
    }


def _redacted(args: dict[str, Any]) -> dict[str, Any]:
    """The KV side channel's shared secret stays out of a file meant for bug reports."""
    return {k: "<redacted>" if "secret" in k and v else v for k, v in args.items()}


def dump_worker_config(config: WorkerConfig) -> None:
    if config.launch.dump_config_to:
        dump_config(config.launch.dump_config_to, config)
