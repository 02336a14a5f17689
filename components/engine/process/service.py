"""``EngineService``: the engine process's side of ``--tokenizer-worker-num N``.

With N > 1 the process that owns a ``CpuEngine`` (its schedule/forward loop and KV pool) lets
N - 1 other processes attach to it (``CpuEngine.attach_tokenizer_worker``), as SGLang's Engine
does: each attached process does its own request handling, templating and tokenization and sends
token ids here. The service runs on its own thread and event loop so that relaying chunks never
waits on the owning process's request handling. Requests of an attached process that exits
(crash or kill) are aborted within ``WATCH_INTERVAL_S``, so their KV pages are freed.

The same service is how a worker reaches an engine process of its own (``--cpu-engine-process
separate``, ``serve.py``); that worker also subscribes to the engine's read-outs and KV events
(``publish.py``).
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
from components.engine.process.outbox import Outbox
from components.engine.process.publish import KvForwarder, ReadoutPublisher

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
        self._publisher: ReadoutPublisher | None = None
        self._kv_peers: set[bytes] = set()
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
        logger.info("engine service on %s", self._address)

        self._post = Outbox(self._loop, sock).post
        self._publisher = ReadoutPublisher(self._engine, self._post, self._busy)
        self._ready.set()
        watch = asyncio.ensure_future(self._watch_peers())
        pushing = asyncio.ensure_future(self._publisher.run())
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
                self._handle(peer, msg)
        finally:
            watch.cancel()
            pushing.cancel()
            for peer in list(self._tasks):
                self._abort_peer(peer)
            sock.close(0)
            ctx.term()

    def _handle(self, peer: bytes, msg: Any) -> None:
        if isinstance(msg, wire.Hello):
            self._pids[peer] = msg.pid
            self._tasks.setdefault(peer, {})
            self._post(peer, self._info)
        elif isinstance(msg, wire.Generate):
            tasks = self._tasks.setdefault(peer, {})
            tasks[msg.rid] = asyncio.ensure_future(self._relay(peer, msg))
            self._publisher.wake()
        elif isinstance(msg, wire.Subscribe):
            self._publisher.subscribe(peer)
            if msg.kv_events:
                self._subscribe_kv(peer)
        elif isinstance(msg, wire.Abort):
            task = self._tasks.get(peer, {}).get(msg.rid)
            if task is not None:
                task.cancel()  # the stream's close aborts the request in the engine
                self._publisher.wake()  # its pages are freed a step later
        elif isinstance(msg, wire.PagesQuery):
            self._post(peer, wire.Pages(in_use=self._engine.kv_pages_in_use()))

    async def _relay(self, peer: bytes, msg: wire.Generate) -> None:
        rid = msg.rid
        try:
            kwargs = dict(msg.kwargs, rid=rid)
            result = await self._engine.async_generate(**kwargs)
            if not kwargs.get("stream"):
                self._publisher.push()  # ahead of the result: read-outs that count it
                self._post(peer, wire.Chunk(rid=rid, chunk=result))
                return
            async for chunk in result:
                if chunk["meta_info"]["finish_reason"] is not None:
                    self._publisher.push()
                self._post(peer, wire.Chunk(rid=rid, chunk=chunk))
        except ValueError as exc:
            self._post(peer, wire.Refused(rid=rid, message=str(exc), invalid=True))
        except RuntimeError as exc:  # the engine is shut down or its thread died
            self._post(peer, wire.Refused(rid=rid, message=str(exc), invalid=False))
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
                    self._publisher.unsubscribe(peer)
                    self._kv_peers.discard(peer)

    def _busy(self) -> bool:
        return any(self._tasks.values())

    def _subscribe_kv(self, peer: bytes) -> None:
        """The engine's KV event listener forwards to the peers that asked (the engine keeps one
        listener: set once, on the first such peer)."""
        if not self._kv_peers:
            self._engine.set_kv_event_listener(KvForwarder(self._loop, self._send_kv))
        self._kv_peers.add(peer)

    def _send_kv(self, calls: list) -> None:
        for peer in self._kv_peers:
            self._post(peer, wire.KvEvents(calls=calls))

    def _abort_peer(self, peer: bytes) -> None:
        for task in self._tasks.pop(peer, {}).values():
            task.cancel()


def attach_info(engine: Any) -> wire.Info:
    """What an attached worker needs to know of the engine: its settings and registration facts.
    The side-channel secret stays in the engine process: attached workers open no side channel."""
    args = dataclasses.asdict(dataclasses.replace(engine.server_args, kv_side_channel_secret=None))
    facts = {"page_size": engine.page_size, "context_length": engine.context_length,
             "max_total_num_tokens": engine.max_total_num_tokens,
             "vocab_size": engine.vocab_size, "eos_token_ids": sorted(engine.eos_token_ids),
             "num_pages": engine.kv_pages_total()}
    return wire.Info(server_args=args, facts=facts)
