"""What registration advertises about an engine, whichever engine runs, and which one can run
(read without importing either)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    context_length: int
    max_total_num_tokens: int
    max_running_requests: int | None
    page_size: int
    # Tokens the engine keeps per request on top of prompt + output (speculative decoding's
    # draft tokens): requests get context_length - reserved_tokens.
    reserved_tokens: int = 0
    # The engine aborts a request at any stage, also before it reached the scheduler (SGLang:
    # components/backends/sglang_aborts.py installed), so the worker may advertise
    # disagg_prefill_cancel_anytime_v1.
    cancel_anytime: bool = True
    # Prompt tokens one forward takes (SGLang's --max-prefill-tokens), advertised as Dynamo
    # 1.6.1 does; None: not advertised.
    max_num_batched_tokens: int | None = None
    # Data-parallel ranks the router may pick (`routing.dp_rank`), registered as Dynamo 1.6.1
    # does (`data_parallel_start_rank` 0, `data_parallel_size`: SGLang's DP ranks, attention-DP
    # ones included).
    dp_size: int = 1
    # SGLang's --dcp-size: its radix tree and KV events count pages of page_size * dcp_size
    # tokens, the block size Dynamo 1.6.1 registers (`capacity.kv_event_block_size`).
    dcp_size: int = 1
    # EAGLE-family speculative decoding: the router aligns its block hashes to SGLang's bigram
    # keys only when the card says `enable_eagle` (1.6.1 derives it the same way).
    enable_eagle: bool = False

    @property
    def kv_block_size(self) -> int:
        """The block size the router hashes by: registered, and given to the KV publishers."""
        return self.page_size * self.dcp_size

    @property
    def request_token_limit(self) -> int:
        return self.context_length - self.reserved_tokens


def sglang_on_cpu() -> bool:
    """SGLang's own switch for its CPU path (read by SGLang itself at import time too). SGLang
    takes exactly "1" (`sglang/srt/platforms/__init__.py`): any other value would have this
    worker set up a CPU engine that SGLang then starts on CUDA, so it is refused."""
    value = os.environ.get("SGLANG_USE_CPU_ENGINE", "")
    if value not in ("", "0", "1"):
        raise SystemExit(f"SGLANG_USE_CPU_ENGINE={value!r}: SGLang reads only 1 (its CPU path) "
                         "or 0/unset (CUDA); set it to 1 or 0")
    return value == "1"
