"""``engine.tokenizer_manager``: the parts of SGLang's TokenizerManager that callers use."""

from __future__ import annotations

import logging
from typing import Any

from components.engine.config import EngineConfig

logger = logging.getLogger(__name__)


class CpuTokenizerManager:
    def __init__(self, tokenizer: Any, server_args: EngineConfig, engine_loop: Any) -> None:
        # The caller's tokenizer (None with skip_tokenizer_init). The engine thread tokenizes and
        # detokenizes with its own copy, so the two threads never share one Rust tokenizer.
        self.tokenizer = tokenizer
        self.server_args = server_args
        self._engine_loop = engine_loop

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Fire-and-forget, thread-safe. The request ends with
        ``{"type": "abort", "message": "Aborted", "status_code": None}`` and frees its KV pages.
        An unknown or finished rid is a no-op."""
        if not rid and not abort_all:
            logger.warning("abort_request called without rid and without abort_all; ignored")
            return
        self._engine_loop.abort(rid, abort_all)
