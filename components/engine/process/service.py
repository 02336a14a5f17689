"""``EngineService``: the engine process's side of ``--tokenizer-worker-num N``.

With N > 1 the process that owns a ``CpuEngine`` (its schedule/forward loop and KV pool) lets
N - 1 other processes attach to it (``CpuEngine.attach_tokenizer_worker``), as SGLang's Engine
does: each attached process does its own request handling, templating and tokenization and sends
token ids here. The service runs on its own thread and event loop so that relaying chunks never
waits on the owning process's request handling. Requests of an attached process that exits
(crash or kill) are aborted within ``WATCH_INTERVAL_S``, so their KV pages are freed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import threading
from typing import Any

import zmq
import zmq.asyncio

from components.engine.process import wire

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


class EngineService:
    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._info = attach_info(engine)
        self._dir = wire.service_dir(os.getpid())
        self._address = wire.service_address(os.getpid())
        self._tasks: dict[bytes, dict[str, asyncio.Task]] = {}  # peer -> rid -> relay task
        self._pids: dict[bytes, int] = {}
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="cpu-engine-service", daemon=True)

    def start(self) -> None:
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"the engine service did not start within {START_TIMEOUT_S}s")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(STOP_TIMEOUT_S)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self._address)
        logger.info("engine service for tokenizer workers on %s", self._address)
        self._ready.set()
        watch = asyncio.ensure_future(self._watch_peers())
        try:
            while not self._stop.is_set():
                if await sock.poll(WATCH_INTERVAL_S * 1000) == 0:
                    continue
                peer, payload = await sock.recv_multipart()
                try:
                    msg = wire.decode_to_engine(payload)
                except Exception as exc:  # msgspec raises DecodeError/ValidationError
                    logger.warning("dropped a malformed message from a tokenizer worker: %s", exc)
                    continue
                self._handle(sock, peer, msg)
        finally:
            watch.cancel()
            for peer in list(self._tasks):
                self._abort_peer(peer)
            sock.close(0)
            ctx.term()

    def _handle(self, sock: Any, peer: bytes, msg: Any) -> None:
        if isinstance(msg, wire.Hello):
            self._pids[peer] = msg.pid
            self._tasks.setdefault(peer, {})
            sock.send_multipart([peer, wire.encode(self._info)])
        elif isinstance(msg, wire.Generate):
            tasks = self._tasks.setdefault(peer, {})
            tasks[msg.rid] = asyncio.ensure_future(self._relay(sock, peer, msg))
        elif isinstance(msg, wire.Abort):
            task = self._tasks.get(peer, {}).get(msg.rid)
            if task is not None:
                task.cancel()  # the stream's close aborts the request in the engine
        elif isinstance(msg, wire.PagesQuery):
            in_use = self._engine.kv_pages_in_use()
            sock.send_multipart([peer, wire.encode(wire.Pages(in_use=in_use))])

    async def _relay(self, sock: Any, peer: bytes, msg: wire.Generate) -> None:
        rid = msg.rid
        try:
            kwargs = dict(msg.kwargs, rid=rid)
            result = await self._engine.async_generate(**kwargs)
            if not kwargs.get("stream"):
                await sock.send_multipart([peer, wire.encode(wire.Chunk(rid=rid, chunk=result))])
                return
            async for chunk in result:
                await sock.send_multipart([peer, wire.encode(wire.Chunk(rid=rid, chunk=chunk))])
        except ValueError as exc:
            await sock.send_multipart(
                [peer, wire.encode(wire.Refused(rid=rid, message=str(exc), invalid=True))])
        except RuntimeError as exc:  # the engine is shut down or its thread died
            await sock.send_multipart(
                [peer, wire.encode(wire.Refused(rid=rid, message=str(exc), invalid=False))])
        finally:
            self._tasks.get(peer, {}).pop(rid, None)

    async def _watch_peers(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for peer, pid in list(self._pids.items()):
                if not wire.process_alive(pid):
                    logger.warning("tokenizer worker %d exited; aborting its %d requests",
                                   pid, len(self._tasks.get(peer, {})))
                    self._abort_peer(peer)
                    del self._pids[peer]

    def _abort_peer(self, peer: bytes) -> None:
        for task in self._tasks.pop(peer, {}).values():
            task.cancel()


def attach_info(engine: Any) -> wire.Info:
    """What an attached worker needs to know of the engine: its settings and registration facts.
    The side-channel secret stays in the engine process: attached workers open no side channel."""
    args = dataclasses.asdict(dataclasses.replace(engine.server_args, kv_side_channel_secret=None))
    facts = {"page_size": engine.page_size, "context_length": engine.context_length,
             "max_total_num_tokens": engine.max_total_num_tokens,
             "vocab_size": engine.vocab_size, "eos_token_ids": sorted(engine.eos_token_ids)}
    return wire.Info(server_args=args, facts=facts)
