"""Chat template + tokenization off the event loop
(docs/reference/preprocessing.md).

One FIFO worker thread does the work, so requests leave preprocessing in arrival order and
the loop keeps streaming other requests while a long prompt is tokenized. The worker uses its
own clone of the fast tokenizer's native backend (two threads on one Rust tokenizer stall each
other and silently mix padding/truncation settings), and per job a shallow copy of the wrapper
pointing at the clone, so settings made later (chat_template) are current. Short inputs run
inline when nothing is outstanding; a slow (pure-Python) tokenizer is serialized by a lock.
"""

import asyncio
import contextvars
import copy
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from jinja2 import TemplateError

from handlers.core.errors import RequestError
from handlers.text.render_budget import RenderTimeout, within_budget

logger = logging.getLogger(__name__)

_STALE = object()  # the job saw a replaced/grown backend: the caller re-runs it inline
_BUSY = object()  # the slow tokenizer's lock was taken: go through the executor


@dataclass(frozen=True)
class PreprocessConfig:
    # SGLang's own threshold for skipping the thread hop (PR #39716): below it a hop costs
    # more than the work.
    inline_max_chars: int = 2048
    # Jinja cost grows with the message count, not only with the characters.
    inline_max_messages: int = 16
    # Wall-clock budget for rendering the template (not tokenizing): the model's own template
    # renders thousands of messages in milliseconds, so only a pathological input hits it.
    render_budget_s: float = 2.0


class _Snapshot(NamedTuple):
    source: Any  # the wrapper's backend when cloned (identity is checked, never used)
    vocab_size: int
    clone: Any  # the worker thread's own backend


def encode_chat(tok: Any, messages: list[dict[str, Any]], template_kwargs: dict,
                budget_s: float = 2.0, tools: Optional[list[dict[str, Any]]] = None
                ) -> list[int]:
    """Render the chat template (within `budget_s`), then encode; ids only (no attention mask
    / type ids, which hold the GIL for milliseconds on long prompts). `tools`: the request's
    tool definitions, for templates that render them."""
    def render() -> str:
        extra = {"tools": tools} if tools else {}  # absent, not None: as before tools existed
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra, **template_kwargs
        )

    try:
        prompt = within_budget(render, budget_s)
    except RenderTimeout as exc:
        raise RequestError(f"messages: the chat template exceeded its time budget ({exc})"
                           ) from None
    except TemplateError as exc:  # raised by the template itself, e.g. role order
        raise RequestError(f"messages: the chat template rejected them: {exc}") from None
    except (TypeError, ValueError) as exc:  # a template variable of the wrong type
        if not template_kwargs:
            raise
        raise RequestError(f"chat_template_kwargs: the chat template failed with them: {exc}"
                           ) from None
    enc = tok(
        prompt,
        add_special_tokens=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    return enc["input_ids"]


class Preprocessor:
    """Owns the worker thread. Create it before serving: the backend clone holds the GIL."""

    def __init__(self, tokenizer: Any, config: PreprocessConfig = PreprocessConfig()) -> None:
        self.tokenizer = tokenizer
        self._cfg = config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess")
        self._outstanding = 0  # jobs submitted and not finished; touched on the loop only
        self._fast = bool(getattr(tokenizer, "is_fast", False)) and hasattr(tokenizer, "_tokenizer")
        self._lock = threading.Lock()  # slow tokenizers are not thread-safe
        self._snapshot: Optional[_Snapshot] = self._clone() if self._fast else None
        self._recloning = False
        self._inline_runs = 0  # jobs run on the loop thread, not the worker; on the loop only

    # --- public -------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Jobs submitted to the worker thread and not finished yet."""
        return self._outstanding

    @property
    def recloning(self) -> bool:
        """A new clone of a replaced or grown tokenizer backend is queued or being taken."""
        return self._recloning

    @property
    def inline_runs(self) -> int:
        """Jobs run inline on the event loop since start, rather than on the worker thread."""
        return self._inline_runs

    @property
    def tokenizer_lock_held(self) -> bool:
        """Whether the slow tokenizer's lock is taken now (a fast tokenizer never takes it)."""
        return self._lock.locked()

    async def chat_token_ids(
        self, messages: list[dict[str, Any]], template_kwargs: Optional[dict] = None,
        tools: Optional[list[dict[str, Any]]] = None,
    ) -> list[int]:
        """Template + tokenize once; the ids go to the engine and to the prefill worker.

        Template variables and tools always send the job to the worker thread: they can switch
        the template onto branches whose cost the message size does not bound."""
        small = not template_kwargs and not tools and (
            len(messages) <= self._cfg.inline_max_messages) and (
            sum(len(m.get("content") or "") for m in messages) <= self._cfg.inline_max_chars
        )
        return await self.run(encode_chat, messages, template_kwargs or {},
                              self._cfg.render_budget_s, tools, inline_ok=small)

    async def run(self, fn: Callable[..., Any], *args: Any, inline_ok: bool = False) -> Any:
        """fn(tokenizer, *args) in arrival order; loop-side users of a slow tokenizer come
        through here rather than taking its lock on the loop."""
        if inline_ok and self._outstanding == 0:
            result = self._run_inline(fn, args)
            if result is not _BUSY:
                return result
        result = await self._submit(self._run_job, fn, args)
        if result is _STALE:
            self._schedule_reclone()
            return fn(self.tokenizer, *args)  # correct, at the price of one loop stall
        return result

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- internals ----------------------------------------------------------------------

    async def _submit(self, job: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()  # run_in_executor does not carry contextvars
        fut = loop.run_in_executor(self._executor, ctx.run, job, *args)
        self._outstanding += 1
        try:
            result = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # A cancelled request's job keeps its place until it has really finished, so
            # no later request runs inline ahead of (or alongside) it.
            if fut.done():
                self._release(fut)
            else:
                fut.add_done_callback(self._release)
            raise
        except BaseException:
            self._outstanding -= 1
            raise
        # Released here, in the waiter, not in a done callback: a callback would let a new
        # request run inline before this waiter resumed, overtaking it.
        self._outstanding -= 1
        return result

    def _release(self, fut: "asyncio.Future[Any]") -> None:
        self._outstanding -= 1
        if not fut.cancelled() and fut.exception() is not None:
            logger.debug("cancelled request's preprocessing failed: %s", fut.exception())

    def _run_inline(self, fn: Callable[..., Any], args: tuple) -> Any:
        if self._fast:
            self._inline_runs += 1
            return fn(self.tokenizer, *args)
        if not self._lock.acquire(blocking=False):
            return _BUSY
        try:
            self._inline_runs += 1
            return fn(self.tokenizer, *args)
        finally:
            self._lock.release()

    def _run_job(self, fn: Callable[..., Any], args: tuple) -> Any:
        """Runs in the worker thread."""
        if not self._fast:
            with self._lock:
                return fn(self.tokenizer, *args)
        snap = self._snapshot
        if snap is None or not self._is_current(snap):
            return _STALE
        job_tok = copy.copy(self.tokenizer)  # 4 µs; picks up the current chat_template
        job_tok._tokenizer = snap.clone  # the property has no setter
        return fn(job_tok, *args)

    def _clone(self) -> _Snapshot:
        source = self.tokenizer._tokenizer
        vocab = source.get_vocab_size(with_added_tokens=True)
        return _Snapshot(source, vocab, copy.deepcopy(source))

    def _is_current(self, snap: _Snapshot) -> bool:
        source = self.tokenizer._tokenizer
        return source is snap.source and source.get_vocab_size(with_added_tokens=True) == (
            snap.vocab_size
        )

    def _schedule_reclone(self) -> None:
        """The wrapper's backend was replaced or grew (add_tokens): take a new snapshot in
        the worker, queued behind the jobs already submitted, off this request's path."""
        if self._recloning:
            return
        self._recloning = True
        logger.info("tokenizer backend changed; re-cloning it for the preprocess worker")

        def reclone() -> None:
            self._snapshot = self._clone()

        def done(fut: Future) -> None:
            self._recloning = False
            if fut.exception() is not None:
                logger.error("re-cloning the tokenizer backend failed: %s", fut.exception())

        self._executor.submit(contextvars.copy_context().run, reclone).add_done_callback(done)
