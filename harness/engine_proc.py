"""A CPU engine in a child process, as a second worker would hold it (tests and benchmarks).

Server: ``python -m harness.engine_proc [--timings] '<CpuEngine kwargs as JSON>'`` sends
``{"ready": true, "server_args": {...}}`` once the engine is up, then serves

    {"op": "generate", "id": N, "kwargs": {...}}   -> {"id": N, "chunk": {...}} per chunk
    {"op": "abort", "rid": R}                        (no reply)
    {"op": "pages", "id": N}                       -> {"id": N, "pages": P}
    {"op": "timings", "id": N, "rid": R, "room": B} -> {"id": N, "timings": {...}}

until its input ends. ``--timings`` records per-request times from the engine's log records
(``harness/engine_timing.py``); without it ``timings`` answers empty values.

Client: ``EngineProcess`` (asyncio), on ``harness.child.ChildProcess``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from harness.child import READY_TIMEOUT_S, ChildProcess, Message, ParentChannel, cpu_seconds
from harness.engine_timing import TimingCapture

MODULE = "harness.engine_proc"
REPLY_TIMEOUT_S = 10.0


# ---- server side -------------------------------------------------------------------------------
class _EngineServer:
    def __init__(self, channel: ParentChannel, engine, capture: TimingCapture | None) -> None:
        self.channel, self.engine, self.capture = channel, engine, capture
        self._tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        self.channel.send({"ready": True, "server_args": self.engine.get_server_info()})
        async for cmd in self.channel.commands():
            op = cmd["op"]
            if op == "generate":
                stream = await self.engine.async_generate(stream=True, **cmd["kwargs"])
                task = asyncio.create_task(self._forward(cmd["id"], stream))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                # The engine sends a stream on its first read: one loop turn lets the task make
                # it before the next command (an abort of this rid) is handled.
                await asyncio.sleep(0)
            elif op == "abort":
                self.engine.tokenizer_manager.abort_request(cmd["rid"])
            elif op == "pages":
                self.channel.send({"id": cmd["id"], "pages": self.engine.kv_pages_in_use()})
            elif op == "timings":
                times = self.capture.request(cmd["rid"], cmd["room"]) if self.capture else {}
                self.channel.send({"id": cmd["id"], "timings": times})
            else:
                raise ValueError(f"unknown op {op!r}")

    async def _forward(self, req_id: int, stream: AsyncIterator[dict]) -> None:
        try:
            async for chunk in stream:
                self.channel.send({"id": req_id, "chunk": chunk})
        except ValueError as exc:  # refused, as SGLang refuses: the client raises it too
            self.channel.send({"id": req_id, "error": str(exc)})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a CpuEngine driven by JSON lines on stdin/stdout")
    p.add_argument("engine_kwargs", type=json.loads, help="CpuEngine keyword arguments, as JSON")
    p.add_argument("--timings", action="store_true", help="record per-request timings")
    args = p.parse_args(argv)
    channel = ParentChannel()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s engine_proc %(name)s: %(message)s")
    capture = TimingCapture.install() if args.timings else None
    # Imported only now: torch and NIXL may print while loading, and fd 1 is stderr from here on.
    from components.engine.process.engine import CpuEngine

    async def run() -> None:
        engine = CpuEngine(**args.engine_kwargs)
        try:
            await _EngineServer(channel, engine, capture).serve()
        finally:
            engine.shutdown()

    asyncio.run(run())


# ---- client side -------------------------------------------------------------------------------
class EngineProcess:
    """An engine in a child process; ``generate`` returns an async iterator of chunks.

    Requests go out when ``generate`` or ``final`` is called, not when first awaited, so the
    caller controls which engine hears of a request first."""

    def __init__(self) -> None:
        self.server_args: dict[str, Any] = {}
        self._child: ChildProcess | None = None
        self._next_id = 0
        self._queues: dict[int, asyncio.Queue[Message | None]] = {}
        self._exited = False

    @classmethod
    async def start(cls, *, capture_timings: bool = False,
                    ready_timeout: float = READY_TIMEOUT_S, **engine_kwargs: Any) -> EngineProcess:
        self = cls()
        loop = asyncio.get_running_loop()

        def deliver(msg: Message | None) -> None:  # on the reader thread
            try:
                loop.call_soon_threadsafe(self._route, msg)
            except RuntimeError:  # the loop is closed: nobody is left to wait for it
                pass

        args = [json.dumps(engine_kwargs), *(["--timings"] if capture_timings else [])]
        self._child = await asyncio.to_thread(ChildProcess.start, MODULE, args, deliver,
                                              ready_timeout)
        self.server_args = self._child.hello["server_args"]
        return self

    def _route(self, msg: Message | None) -> None:
        if msg is None:  # the process exited: wake every waiter
            self._exited = True
            for q in self._queues.values():
                q.put_nowait(None)
            return
        q = self._queues.get(msg.get("id"))
        if q is not None:
            q.put_nowait(msg)

    def _send(self, op: str, **fields: Any) -> tuple[int, asyncio.Queue[Message | None]]:
        if self._exited:
            raise ConnectionError("engine process exited")
        self._next_id += 1
        q: asyncio.Queue[Message | None] = asyncio.Queue()
        self._queues[self._next_id] = q
        self._child.send({"op": op, "id": self._next_id, **fields})
        return self._next_id, q

    def generate(self, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        """Send one request now; its chunks as they come, up to the finished one."""
        req_id, q = self._send("generate", kwargs=kwargs)
        return self._chunks(req_id, q)

    async def _chunks(self, req_id: int, q: asyncio.Queue) -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                msg = await q.get()  # bounded by the caller, as for an in-process engine
                if msg is None:
                    raise ConnectionError("engine process exited")
                if "error" in msg:
                    raise ValueError(msg["error"])
                yield msg["chunk"]
                if msg["chunk"]["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            self._queues.pop(req_id, None)

    def final(self, **kwargs: Any) -> Coroutine[Any, Any, dict[str, Any]]:
        """Send one request now; awaits its last chunk, with the cumulative output_ids."""
        return _last_chunk(self.generate(**kwargs))

    def abort(self, rid: str) -> None:
        self._child.send({"op": "abort", "rid": rid})

    async def _call(self, op: str, **fields: Any) -> Message:
        req_id, q = self._send(op, **fields)
        try:
            msg = await asyncio.wait_for(q.get(), REPLY_TIMEOUT_S)
        finally:
            self._queues.pop(req_id, None)
        if msg is None:
            raise ConnectionError("engine process exited")
        return msg

    async def pages_in_use(self) -> int:
        return (await self._call("pages"))["pages"]

    async def timings(self, rid: str, room: int | None = None) -> dict[str, float | None]:
        """A request's times (``TimingCapture.request``); needs ``capture_timings``."""
        return (await self._call("timings", rid=rid, room=room))["timings"]

    @property
    def pid(self) -> int:
        """The engine process's id (what ``CpuEngine.attach_tokenizer_worker`` takes)."""
        return self._child.pid

    def cpu_seconds(self) -> float:
        return cpu_seconds(self._child.pid)

    def kill(self) -> None:
        self._child.kill()

    async def close(self) -> None:
        await asyncio.to_thread(self._child.close)


async def _last_chunk(chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    ids: list[int] = []
    last: dict[str, Any] = {}
    async for chunk in chunks:
        ids += chunk["output_ids"]
        last = chunk
    return {**last, "output_ids": ids}


if __name__ == "__main__":
    main()
