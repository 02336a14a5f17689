"""SGLang-named flags for the embedded CPU engine.

The spellings, choices and meanings match `sglang.srt.server_args.ServerArgs` (a test parses the
launch scripts with the real one), so a launch line is valid for either engine. Flags SGLang has
but the CPU engine cannot honour are accepted only with their neutral value, and say so. The few
`--cpu-*` flags are CPU-engine knobs with no SGLang counterpart.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from components.engine.config import (DISAGG_MODES, TRANSFER_BACKENDS, UCX_ERROR_HANDLING,
                                      EngineConfig)

# EngineConfig is the one home of the engine's defaults; flags show and pass the same values.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}

# SGLang --dtype spellings -> torch dtype names the CPU engine takes; "auto" = engine default.
_DTYPES = {"auto": None, "float": "float32", "float32": "float32", "half": "float16",
           "float16": "float16", "bfloat16": "bfloat16"}

# Optional engine knobs: ns attribute -> EngineConfig field. Passed on only when given, so the
# engine's EngineConfig stays the single source of defaults.
_OPTIONAL = {
    "page_size": "page_size",
    "context_length": "context_length",
    "max_running_requests": "max_running_requests",
    "max_total_tokens": "max_total_tokens",
    "random_seed": "random_seed",
    "stream_interval": "stream_interval",
    "tokenizer_worker_num": "tokenizer_worker_num",
    "max_prefill_tokens": "max_prefill_tokens",
    "chunked_prefill_size": "chunked_prefill_size",
    "constrained_json_max_whitespace_cnt": "constrained_json_max_whitespace_cnt",
    "cpu_num_threads": "num_threads",
    "cpu_bootstrap_timeout": "bootstrap_timeout",
    "cpu_transfer_timeout": "transfer_timeout",
    "cpu_kv_side_channel_secret": "kv_side_channel_secret",
    "cpu_kv_ucx_error_handling": "kv_ucx_error_handling",
}
IN_PROCESS, SEPARATE = "in-process", "separate"
ENGINE_PROCESS_CHOICES = (IN_PROCESS, SEPARATE)
# In the engine args only with `separate` (CpuBackend.build takes it out before the engine's).
ENGINE_PROCESS_KEY = "cpu_engine_process"
SIDE_CHANNEL_SECRET_ENV = "DYN_KV_SIDE_CHANNEL_SECRET"
UCX_ERROR_HANDLING_ENV = "DYN_KV_UCX_ERROR_HANDLING"


def add_cpu_engine_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Engine (SGLang flag names; embedded CPU engine)")
    g.add_argument("--model-path", required=True, help="local Hugging Face model directory")
    g.add_argument("--tokenizer-path", default=None, help="must equal --model-path if given")
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--skip-tokenizer-init", action="store_true",
                   help="token-in/token-out: the frontend tokenizes (ModelInput.Tokens)")
    g.add_argument("--disaggregation-mode", choices=DISAGG_MODES,
                   default=str(_DEFAULTS["disaggregation_mode"]))
    g.add_argument("--disaggregation-bootstrap-port", type=int,
                   default=_DEFAULTS["disaggregation_bootstrap_port"])
    g.add_argument("--disaggregation-transfer-backend", choices=TRANSFER_BACKENDS,
                   default=_DEFAULTS["disaggregation_transfer_backend"],
                   help="the CPU engine moves KV with NIXL only")
    g.add_argument("--host", default=_DEFAULTS["host"], help="bind address of the bootstrap server")
    g.add_argument("--page-size", type=int, default=None)
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    g.add_argument("--dtype", choices=sorted(_DTYPES), default="auto")
    g.add_argument("--random-seed", type=int, default=None)
    g.add_argument("--stream-interval", type=int, default=None)
    g.add_argument("--tokenizer-worker-num", type=int, default=None,
                   help="processes serving the endpoint on this engine: each does its own "
                        "request handling and tokenization (default 1)")
    g.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="prompt tokens forwarded per prefill step")
    g.add_argument("--chunked-prefill-size", type=int, default=None,
                   help="forward long prompts in chunks of this many tokens (-1: off)")
    g.add_argument("--enable-metrics", action="store_true",
                   help="accepted for SGLang launch lines: the worker's Prometheus metrics are "
                        "always on its system port's /metrics (DYN_SYSTEM_PORT)")
    g.add_argument("--enable-mixed-chunk", action="store_true",
                   help="run prefill chunks and the running rows' decode in one forward")
    g.add_argument("--disable-radix-cache", action="store_true",
                   help="do not keep finished requests' KV to serve repeated prefixes")
    g.add_argument("--disaggregation-decode-enable-radix-cache", action="store_true",
                   help="a decode engine keeps a prefix cache: the prefill sends only the KV of "
                        "the prompt tokens it lacks")
    g.add_argument("--constrained-json-disable-any-whitespace", action="store_true",
                   help="structured output: compact JSON, no whitespace between tokens")
    g.add_argument("--constrained-json-max-whitespace-cnt", type=int, default=None,
                   help="structured output: at most this many whitespace characters in a row "
                        "in JSON (default: any number)")
    g.add_argument("--kv-events-config", default=None,
                   help='JSON, e.g. {"publisher":"zmq"}: publish prefix-cache blocks and load for '
                        "Dynamo's KV router (the CPU engine reports them in-process; "
                        "'endpoint' is not used)")
    g.add_argument("--tool-call-parser", default=None,
                   help="SGLang's tool call parser (e.g. qwen25, hermes): Text mode parses the "
                        "generated text into tool_calls (names checked at startup)")
    g.add_argument("--reasoning-parser", default=None,
                   help="SGLang's reasoning parser (e.g. qwen3): Text mode splits "
                        "reasoning_content from content (names checked at startup)")
    g.add_argument("--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int,
                   default=1, help="the CPU engine runs one rank: only 1")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for SGLang compatibility; local models only")
    g.add_argument("--log-level", default="info")
    g.add_argument("--cpu-engine-process", choices=ENGINE_PROCESS_CHOICES, default=IN_PROCESS,
                   help="where the engine's schedule/forward loop runs: on a thread of the "
                        "worker process (in-process) or in an engine process the worker starts "
                        "and owns (separate: its own GIL; not with --tokenizer-worker-num > 1)")
    g.add_argument("--cpu-num-threads", type=int, default=None, help="torch intra-op threads")
    g.add_argument("--cpu-bootstrap-timeout", type=float, default=None,
                   help="seconds a transfer may wait for its peer to register")
    g.add_argument("--cpu-transfer-timeout", type=float, default=None,
                   help="seconds a KV transfer may take")
    g.add_argument("--cpu-kv-side-channel-secret", default=os.environ.get(SIDE_CHANNEL_SECRET_ENV),
                   help="shared secret that authenticates KV side-channel peers (same on every "
                        f"prefill and decode; prefer the {SIDE_CHANNEL_SECRET_ENV} environment "
                        "variable, which is the default, over the command line)")
    g.add_argument("--cpu-kv-ucx-error-handling", choices=UCX_ERROR_HANDLING,
                   default=os.environ.get(UCX_ERROR_HANDLING_ENV),
                   help="NIXL's UCX endpoint error handling, the same on every prefill and decode "
                        "(default none: a KV WRITE completes without waiting for the decode; "
                        f"peer is NIXL's default; env {UCX_ERROR_HANDLING_ENV})")


def engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig kwargs from the parsed namespace; rejects what the CPU engine cannot do."""
    if ns.tp_size != 1:
        raise SystemExit(f"--tp-size {ns.tp_size}: the CPU engine runs a single rank (use 1)")
    if ns.tokenizer_path not in (None, ns.model_path):
        raise SystemExit("--tokenizer-path: the CPU engine loads the tokenizer from --model-path")
    kwargs: dict[str, Any] = {
        "model_path": ns.model_path,
        "served_model_name": ns.served_model_name or ns.model_path,
        "skip_tokenizer_init": bool(ns.skip_tokenizer_init),
        "disaggregation_mode": ns.disaggregation_mode,
        "disaggregation_bootstrap_port": int(ns.disaggregation_bootstrap_port),
        "disaggregation_transfer_backend": ns.disaggregation_transfer_backend,
        "host": ns.host,
    }
    if _DTYPES[ns.dtype] is not None:
        kwargs["dtype"] = _DTYPES[ns.dtype]
    for flag in ("enable_mixed_chunk", "disable_radix_cache",
                 "disaggregation_decode_enable_radix_cache",
                 "constrained_json_disable_any_whitespace"):
        if getattr(ns, flag):
            kwargs[flag] = True
    for attr, field in _OPTIONAL.items():
        value = getattr(ns, attr)
        if value is not None:
            kwargs[field] = value
    if ns.cpu_engine_process == SEPARATE:
        if (ns.tokenizer_worker_num or 1) > 1:
            # Attached processes find their engine by their parent's pid; an engine process
            # would be their sibling. Either split pays for the GIL: pick one.
            raise SystemExit("--cpu-engine-process separate cannot be combined with "
                             "--tokenizer-worker-num > 1: use one or the other")
        kwargs[ENGINE_PROCESS_KEY] = SEPARATE
    return kwargs
