"""``AttachedCpuEngine``: the Engine API in a tokenizer worker process, run by another process's
CPU engine (``CpuEngine.attach_tokenizer_worker``, the CPU twin of SGLang's
``Engine.attach_tokenizer_worker``).

The caller's request handling, templating and tokenization stay in this process; the engine
process schedules and forwards. Streams keep ``CpuEngine``'s semantics (``engine_streams.py``):
sent on the first read, refused requests raise ``ValueError``, a closed stream aborts. If the
engine process exits, every live request ends with an abort within ``WATCH_INTERVAL_S`` and
new requests raise ``RuntimeError``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from transformers import AutoTokenizer

from components.engine.process import wire
from components.engine.config import EngineConfig
from components.engine.api.requests import choice_rows
from components.engine.api.streams import raise_if_refused, stream_chunks
from components.engine.api.sync import SyncGenerateMixin

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
QUERY_TIMEOUT_S = 2.0
WATCH_INTERVAL_S = 0.25
ENGINE_GONE = "the engine process exited"


@dataclass
class _Pending:
    queue: asyncio.Queue
    remaining: int  # final chunks still to come


class _AttachedTokenizerManager:
    def __init__(self, tokenizer: Any, engine: "AttachedCpuEngine") -> None:
        self.tokenizer = tokenizer
        self._engine = engine

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._engine._abort(rid, abort_all)


class AttachedCpuEngine(SyncGenerateMixin):
    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self._address = wire.service_address(parent_pid)
        info = self._hello()
        self.server_args = EngineConfig.from_kwargs(**info.server_args)
        self._facts = info.facts
        tokenizer = None
        if not self.server_args.skip_tokenizer_init:
            tokenizer = AutoTokenizer.from_pretrained(self.server_args.model_path)
        self.tokenizer_manager = _AttachedTokenizerManager(tokenizer, self)
        self._queues: dict[str, _Pending] = {}
        self._sock: Any = None
        self._ctx: Any = None
        self._receiver: asyncio.Task | None = None
        self._gone = False
        self._query_lock = threading.Lock()

    def _hello(self) -> wire.Info:
        ctx = zmq.Context.instance()
        with ctx.socket(zmq.DEALER) as sock:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._address)
            sock.send(wire.encode(wire.Hello(pid=os.getpid())))
            if not sock.poll(CONNECT_TIMEOUT_S * 1000):
                raise RuntimeError(f"no CPU engine answered on {self._address} within "
                                   f"{CONNECT_TIMEOUT_S:.0f}s (is the parent running with "
                                   "--tokenizer-worker-num > 1?)")
            reply = wire.decode_to_worker(sock.recv())
        if not isinstance(reply, wire.Info):
            raise RuntimeError(f"unexpected reply from the CPU engine: {type(reply).__name__}")
        return reply

    # ---- registration facts (the engine process's) --------------------------------------------
    page_size = property(lambda self: int(self._facts["page_size"]))
    context_length = property(lambda self: int(self._facts["context_length"]))
    max_total_num_tokens = property(lambda self: int(self._facts["max_total_num_tokens"]))
    vocab_size = property(lambda self: int(self._facts["vocab_size"]))
    eos_token_ids = property(lambda self: frozenset(self._facts["eos_token_ids"]))

    @property
    def max_running_requests(self) -> int:
        return self.server_args.max_running_requests

    def kv_pages_in_use(self) -> int:
        """The engine process's KV pool occupancy (one blocking query, bounded)."""
        with self._query_lock, zmq.Context.instance().socket(zmq.DEALER) as sock:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._address)
            sock.send(wire.encode(wire.PagesQuery()))
            if not sock.poll(QUERY_TIMEOUT_S * 1000):
                raise RuntimeError(f"the CPU engine did not answer within {QUERY_TIMEOUT_S}s")
            return wire.decode_to_worker(sock.recv()).in_use

    # ---- generation ---------------------------------------------------------------------------
    async def async_generate(self, prompt: str | None = None,
                             sampling_params: dict[str, Any] | None = None,
                             input_ids: list[int] | None = None, stream: bool = False,
                             rid: str | None = None, **kwargs: Any
                             ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """``CpuEngine.async_generate``, run by the engine process. Arguments travel as
        msgpack; the engine process validates them, and its refusals raise here."""
        rid = rid if rid is not None else uuid.uuid4().hex
        sent = {k: v for k, v in kwargs.items() if v is not None}
        sent.update(prompt=prompt, sampling_params=sampling_params, input_ids=input_ids,
                    stream=stream)
        self._ensure_receiver()
        # A stream ends when every choice has finished; without streaming one message comes.
        n = int((sampling_params or {}).get("n", 1) or 1)
        expected = choice_rows(n, self.server_args.disaggregation_mode) if stream else 1

        async def start() -> asyncio.Queue:
            if self._gone:
                raise RuntimeError(ENGINE_GONE)
            if rid in self._queues:
                raise ValueError(f"Duplicate request ID detected: {rid}")
            queue: asyncio.Queue = asyncio.Queue()
            self._queues[rid] = _Pending(queue, expected)
            self._send(wire.Generate(rid=rid, kwargs=sent))
            return queue

        def abort() -> None:
            self._abort(rid, False)

        if stream:
            return stream_chunks(start, abort, expected)
        queue = await start()
        try:
            result = await queue.get()
        except asyncio.CancelledError:  # the request must not keep running (and holding KV)
            abort()
            raise
        if isinstance(result, dict):
            raise_if_refused(result)
        return result

    def _send(self, msg: Any) -> None:
        self._sock.send(wire.encode(msg))

    def _abort(self, rid: str, abort_all: bool) -> None:
        """Abort in the engine process, and end the request's stream here at once with the
        engine's own abort (SGLang's semantics: a stream still being read ends; nothing the
        engine process sends for it later is delivered)."""
        rids = list(self._queues) if abort_all else [rid]
        for one in rids:
            pending = self._queues.pop(one, None)
            if pending is None:
                continue
            if not self._gone:
                self._send(wire.Abort(rid=one))
            for _ in range(pending.remaining):
                pending.queue.put_nowait(_aborted_chunk(one))

    def _ensure_receiver(self) -> None:
        if self._receiver is None:
            self._ctx = zmq.asyncio.Context()
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self._address)
            self._sock.send(wire.encode(wire.Hello(pid=os.getpid())))
            self._receiver = asyncio.ensure_future(self._receive())

    # How often the receiver checks that the engine process runs; None: never (the owner of an
    # engine process is told at once by its pidfd, RemoteCpuEngine).
    _watch_interval_s: float | None = WATCH_INTERVAL_S

    async def _receive(self) -> None:
        interval = self._watch_interval_s
        while True:
            if await self._sock.poll(None if interval is None else interval * 1000) == 0:
                if not wire.process_alive(self.parent_pid):
                    self._engine_gone()
                    return
                continue
            msg = wire.decode_to_worker(await self._sock.recv())
            for one in msg.items if isinstance(msg, wire.Batch) else (msg,):
                self._deliver(one)

    def _deliver(self, msg: Any) -> None:
        if not isinstance(msg, (wire.Chunk, wire.Refused)):
            self._pushed(msg)
            return
        pending = self._queues.get(msg.rid)
        if pending is None:
            return  # finished, or aborted here already
        if isinstance(msg, wire.Refused):
            del self._queues[msg.rid]
            for _ in range(pending.remaining):  # every choice of a stream ends
                pending.queue.put_nowait(_refusal_chunk(msg.rid, msg.message, msg.invalid))
            return
        chunk = msg.chunk
        if not isinstance(chunk, dict) or chunk["meta_info"]["finish_reason"] is not None:
            pending.remaining -= 1
            if pending.remaining == 0:
                del self._queues[msg.rid]
        pending.queue.put_nowait(chunk)

    def _pushed(self, msg: Any) -> None:
        """A message that answers no request: the Info answering this socket's Hello, or what a
        subscriber is pushed (RemoteCpuEngine)."""

    def _engine_gone(self) -> None:
        if self._gone:
            return
        logger.error("%s (pid %d); ending %d live requests", ENGINE_GONE, self.parent_pid,
                     len(self._queues))
        self._gone = True
        for rid, pending in list(self._queues.items()):
            for _ in range(pending.remaining):  # every choice of a stream ends
                pending.queue.put_nowait(_refusal_chunk(rid, ENGINE_GONE, invalid=False))
        self._queues.clear()

    def shutdown(self) -> None:
        """Closes this process's connection; the engine process keeps running."""
        if self._receiver is not None:
            self._receiver.cancel()
            self._sock.close(0)
            self._ctx.term()
            self._receiver = None


def _aborted_chunk(rid: str) -> dict[str, Any]:
    """What the engine's stream ends with when its request is aborted."""
    return {"text": "", "output_ids": [], "meta_info": {
        "id": rid, "finish_reason": {"type": "abort", "message": "Aborted", "status_code": None},
        "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}


def _refusal_chunk(rid: str, message: str, invalid: bool) -> dict[str, Any]:
    # 400 is what engine_streams turns into ValueError; the engine's own failures end the
    # request with an abort the handlers report as an engine error, as a failed transfer does.
    return {"text": "", "output_ids": [], "meta_info": {
        "id": rid, "finish_reason": {"type": "abort", "message": message,
                                     "status_code": 400 if invalid else 503},
        "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}

