"""Settings of the embedded CPU engine, named like SGLang's ``ServerArgs`` fields."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any


class DisaggregationMode(enum.StrEnum):
    """SGLang's ``disaggregation_mode`` values (aggregated is spelled "null")."""

    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


DISAGG_MODES = tuple(m.value for m in DisaggregationMode)
TRANSFER_BACKENDS = ("nixl",)
UCX_ERROR_HANDLING = ("none", "peer")
DTYPES = ("float32", "bfloat16", "float16")
# Waits for a peer are bounded; the issue caps the default at 30 s.
MAX_DEFAULT_TIMEOUT_S = 30.0
DEFAULT_POOL_TOKENS = 65536
DEFAULT_POOL_BYTES = 256 << 20


# SGLang sizes its default chunk by device memory (2048 below 20 GB, 4096 below 60 GB; on CPU,
# the RAM of a NUMA node); here it is sized by what one chunk costs on the CPU engine
# (benchmarks/bench_abort_latency.py): under a second of forward on the `small` model, and a
# 6,000-token prompt prefills as fast in chunks of 512 as whole (9.1-9.9 s either way).
DEFAULT_CHUNKED_PREFILL_SIZE = 512


@dataclass(frozen=True)
class EngineConfig:
    """What an ``CpuEngine(**kwargs)`` call accepts; every name matches SGLang's ServerArgs."""

    model_path: str
    served_model_name: str | None = None
    skip_tokenizer_init: bool = False
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "nixl"
    host: str = "127.0.0.1"
    page_size: int = 16
    context_length: int | None = None
    max_running_requests: int = 16
    # KV pool size in tokens (SGLang's name). None: as many as fit in DEFAULT_POOL_BYTES,
    # at most DEFAULT_POOL_TOKENS (32 MiB for the tiny model, 256 MiB for the small one).
    max_total_tokens: int | None = None
    dtype: str = "float32"
    random_seed: int = 0
    num_threads: int = 1
    bootstrap_timeout: float = MAX_DEFAULT_TIMEOUT_S
    transfer_timeout: float = MAX_DEFAULT_TIMEOUT_S
    stream_interval: int = 1
    # Tokens of prompt prefilled per scheduler step before running rows get their decode step;
    # a bound on how long one step can delay the running batch (at least one prefill per step).
    max_prefill_tokens: int = 8192
    # SGLang's chunked prefill: a longer prompt is forwarded in pieces of at most this many
    # tokens, with decode steps of the running batch between them. -1: off. On by default, as
    # in SGLang: one engine step (what an abort, a health check or a short request waits
    # behind) is then one chunk's forward, not a whole batch of long prompts.
    chunked_prefill_size: int | None = DEFAULT_CHUNKED_PREFILL_SIZE
    # SGLang's mixed chunked prefill: a step forwards the prefill chunks and the running rows'
    # decode tokens together, so a long prompt delays running rows by one chunk at most.
    enable_mixed_chunk: bool = False
    # SGLang's radix cache is on by default; this flag turns the prefix cache off.
    disable_radix_cache: bool = False
    # SGLang's flag: a decode engine keeps a prefix cache too (off by default, as in SGLang).
    # The prompt's first tokens it holds are copied from there, and the prefill WRITEs only the
    # rest: a conversation's next turn on the same decode moves only its new tokens.
    disaggregation_decode_enable_radix_cache: bool = False
    # Shared secret of the KV side channel (HMAC of each peer's Hello); the same on every prefill
    # and decode. None: peers are not authenticated (fine while the bootstrap server listens on
    # loopback or a private network).
    kv_side_channel_secret: str | None = dataclasses.field(default=None, repr=False)
    # NIXL's UCX endpoint error handling, the same on every prefill and decode. "none": a WRITE
    # completes inside the call that posts it; "peer" (NIXL's default) makes its completion wait
    # for the decode to progress UCX (up to a poll slice or a whole decode step). See
    # kv_transport/nixl_endpoint.py.
    kv_ucx_error_handling: str = "none"
    # SGLang's --tokenizer-worker-num: with N > 1, N - 1 other processes may attach to this
    # engine (CpuEngine.attach_tokenizer_worker) and send it tokenized requests.
    tokenizer_worker_num: int = 1
    # Structured output (SGLang's names): JSON without free whitespace between tokens, or at
    # most this many whitespace characters in a row (None: any number, SGLang's default).
    constrained_json_disable_any_whitespace: bool = False
    constrained_json_max_whitespace_cnt: int | None = None
    log_level: str | None = None  # accepted for SGLang compatibility; the embedding process
    #                               configures logging

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path:
            raise ValueError("model_path must be the path of a Hugging Face model directory")
        if self.served_model_name is None:
            object.__setattr__(self, "served_model_name", self.model_path)
        if self.disaggregation_mode not in DISAGG_MODES:
            raise ValueError(
                f"disaggregation_mode must be one of {DISAGG_MODES}, "
                f"got {self.disaggregation_mode!r}"
            )
        object.__setattr__(self, "disaggregation_mode",
                           DisaggregationMode(self.disaggregation_mode))
        if self.disaggregation_transfer_backend not in TRANSFER_BACKENDS:
            raise ValueError(
                "the CPU engine supports disaggregation_transfer_backend "
                f"{TRANSFER_BACKENDS}, got {self.disaggregation_transfer_backend!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        # 0: bind a free port (prefill), reported back through Engine.server_args.
        _require_int_range("disaggregation_bootstrap_port", self.disaggregation_bootstrap_port,
                           0, 65535)
        _require_int_range("page_size", self.page_size, 1, 4096)
        _require_int_range("max_running_requests", self.max_running_requests, 1, 4096)
        if self.max_total_tokens is not None:
            _require_int_range("max_total_tokens", self.max_total_tokens, self.page_size, 1 << 31)
        _require_int_range("num_threads", self.num_threads, 1, 1024)
        _require_int_range("tokenizer_worker_num", self.tokenizer_worker_num, 1, 64)
        _require_int_range("stream_interval", self.stream_interval, 1, 1 << 20)
        _require_int_range("max_prefill_tokens", self.max_prefill_tokens, 1, 1 << 31)
        _require_int_range("random_seed", self.random_seed, 0, 2**63 - 1)
        if self.chunked_prefill_size == -1:
            object.__setattr__(self, "chunked_prefill_size", None)
        if self.chunked_prefill_size is not None:
            _require_int_range("chunked_prefill_size", self.chunked_prefill_size, 1, 1 << 31)
        if self.constrained_json_max_whitespace_cnt is not None:
            _require_int_range("constrained_json_max_whitespace_cnt",
                               self.constrained_json_max_whitespace_cnt, 0, 1 << 20)
        for name in ("enable_mixed_chunk", "disable_radix_cache",
                     "disaggregation_decode_enable_radix_cache",
                     "constrained_json_disable_any_whitespace"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        if self.context_length is not None:
            _require_int_range("context_length", self.context_length, 2, 1 << 31)
        for name in ("bootstrap_timeout", "transfer_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        secret = self.kv_side_channel_secret
        if secret is not None and (not isinstance(secret, str) or not 16 <= len(secret) <= 4096):
            raise ValueError("kv_side_channel_secret must be a string of 16 to 4096 characters")
        if self.kv_ucx_error_handling not in UCX_ERROR_HANDLING:
            raise ValueError(f"kv_ucx_error_handling must be one of {UCX_ERROR_HANDLING}, got "
                             f"{self.kv_ucx_error_handling!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError("host must be a non-empty address to bind side channels to")

    def num_pages(self, bytes_per_token: int) -> int:
        """KV pool size in pages (rounded down to whole pages)."""
        tokens = self.max_total_tokens
        if tokens is None:
            tokens = min(DEFAULT_POOL_TOKENS, DEFAULT_POOL_BYTES // bytes_per_token)
        return max(tokens // self.page_size, 1)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """From ``CpuEngine(**kwargs)``; unknown names raise TypeError, as SGLang's ServerArgs
        does."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(
                f"Unexpected keyword argument(s) for the CPU engine: {', '.join(unknown)}. "
                f"Accepted: {', '.join(sorted(known))}"
            )
        if "model_path" not in kwargs:
            raise TypeError("CpuEngine() missing required keyword argument: 'model_path'")
        return cls(**kwargs)


def _require_int_range(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
