"""Structured output on the CPU engine: SGLang's grammar constraints on xgrammar.

A request with one of SGLang's ``json_schema``, ``regex``, ``ebnf`` or ``structural_tag``
sampling parameters gets a compiled grammar before it reaches the engine thread: compilation
runs on this module's own worker thread, cached per (kind, text), and the caller waits for it at
most ``compile_timeout_s``. A grammar that does not compile refuses the request with xgrammar's
message (a 400), as SGLang's xgrammar backend does. On the engine thread each constrained row's
matcher fills a token bitmask that is applied to its logits before sampling, then advances with
the sampled token; a matcher that reaches its end finishes the request (SGLang's
``FINISH_MATCHED_TOKEN``). Why xgrammar: docs/reference/structured-output.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import xgrammar as xgr

from protocol.structural_tag import structural_tag_arg

logger = logging.getLogger(__name__)

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
COMPILE_TIMEOUT_S = 10.0
CACHE_ENTRIES = 256
_SGLANG_KEYS = {"json_schema": "json"}
# xgrammar prefixes its errors with "[time] /path/file.cc:line: "; the client needs the rest.
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarBackend:
    """Compiles and caches grammars off the engine thread; thread-safe."""

    def __init__(self, model_path: str, vocab_size: int, eos_ids: frozenset[int], *,
                 any_whitespace: bool = True, max_whitespace_cnt: int | None = None,
                 compile_timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self._model_path = model_path
        # SGLang's --constrained-json-disable-any-whitespace / --constrained-json-max-whitespace-cnt
        self._whitespace = {"any_whitespace": any_whitespace,
                            "max_whitespace_cnt": max_whitespace_cnt}
        self._vocab_size = vocab_size
        self._eos_ids = sorted(eos_ids)
        self._timeout = compile_timeout_s
        # One thread: compiles queue behind each other instead of taking cores from the engine.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._compiler: xgr.GrammarCompiler | None = None  # built by the first compile
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._compiles = 0  # under _lock

    @property
    def compiles(self) -> int:
        """Grammars sent to compile since start (a cached (kind, text) is not compiled again)."""
        with self._lock:
            return self._compiles

    async def request_grammar(self, kind: str, text: str) -> "RequestGrammar":
        """The request's own matcher; ValueError (a 400) if it does not compile in time."""
        future = asyncio.wrap_future(self._compiled(kind, text))
        try:
            compiled = await asyncio.wait_for(asyncio.shield(future), self._timeout)
        except asyncio.TimeoutError:
            future.add_done_callback(_retrieve)  # the compile goes on; nobody awaits it now
            raise ValueError(f"Grammar compilation of {kind} did not finish within "
                             f"{self._timeout:.0f} s") from None
        except (RuntimeError, ValueError, TypeError) as exc:
            # SGLang's message, with its key name ("json" for json_schema)
            raise ValueError(f"Failed to compile {_SGLANG_KEYS.get(kind, kind)} grammar: "
                             f"{_message(exc)}") from None
        return RequestGrammar(xgr.GrammarMatcher(compiled))

    def _compiled(self, kind: str, text: str) -> Future:
        key = (kind, text)
        with self._lock:
            future = self._cache.get(key)
            if future is None:
                future = self._pool.submit(self._compile, kind, text)
                self._compiles += 1
                self._cache[key] = future
                if len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            return future

    def _compile(self, kind: str, text: str) -> xgr.CompiledGrammar:
        compiler = self._compiler or self._make_compiler()
        if kind == "json_schema":
            json.loads(text)  # a clear message for text that is not JSON at all
            return compiler.compile_json_schema(text, **self._whitespace)
        if kind == "regex":
            return compiler.compile_regex(text)
        if kind == "ebnf":
            return compiler.compile_grammar(text)
        return compiler.compile_structural_tag(structural_tag_arg(text, **self._whitespace))

    def _make_compiler(self) -> xgr.GrammarCompiler:
        from transformers import AutoTokenizer  # only engines that get constrained requests

        tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self._vocab_size,
                                                  stop_token_ids=self._eos_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        logger.info("grammar compiler ready: vocab=%d type=%s", self._vocab_size,
                    info.vocab_type.name)
        return self._compiler

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class RequestGrammar:
    """One request's grammar state; used on the engine thread only once submitted."""

    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


class BitmaskApplier:
    """Masks the constrained rows' logits in place (engine thread); one bitmask buffer reused."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def apply(self, logits: torch.Tensor, grammars: list[RequestGrammar | None]) -> None:
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if not rows:
            return
        if self._bitmask.shape[0] < len(grammars):
            self._bitmask = xgr.allocate_token_bitmask(len(grammars), self._vocab_size)
        for i in rows:
            grammars[i].matcher.fill_next_token_bitmask(self._bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, self._bitmask[:len(grammars)],
                                        vocab_size=self._vocab_size, indices=rows)


def grammar_of(params: Any) -> tuple[str, str] | None:
    """(kind, text) of the one grammar a SamplingParams asks for, or None."""
    for kind in GRAMMAR_KINDS:
        text = getattr(params, kind)
        if text is not None:
            return kind, text
    return None


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # marks a late failure as seen, so asyncio does not log it


def _message(exc: BaseException) -> str:
    return _XGR_PREFIX.sub("", str(exc).strip()).strip()
