"""Run a CPU engine in its own process, driven over stdin/stdout with JSON lines.

Server (``python -m tests.engine_proc '<engine kwargs as JSON>'``): prints
``{"ready": true, "server_args": {...}}`` once the engine is up, then serves
``{"op": "generate", "id": N, "kwargs": {...}}`` (streams ``{"id": N, "chunk": {...}}``),
``{"op": "abort", "rid": ...}``, ``{"op": "pages", "id": N}`` and ``{"op": "shutdown"}``.

Client: ``EngineProcess`` (asyncio) starts it in its own process group and kills the group on
close, with a bounded wait.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

READY_TIMEOUT_S = 60.0


# ---- server side ----------------------------------------------------------------------------
async def _serve(engine_kwargs: dict[str, Any]) -> None:
    from components.engine.engine import CpuEngine

    # Libraries (NIXL) log to stdout: keep the protocol on a private copy of the original fd 1.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    engine = CpuEngine(**engine_kwargs)

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    send({"ready": True, "server_args": engine.get_server_info()})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()

    async def forward(req_id: int, stream) -> None:
        async for chunk in stream:
            send({"id": req_id, "chunk": chunk})

    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd["op"] == "generate":
            # Submitted before the next command is read, so a later abort finds the request.
            stream = await engine.async_generate(stream=True, **cmd["kwargs"])
            task = asyncio.create_task(forward(cmd["id"], stream))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif cmd["op"] == "abort":
            engine.tokenizer_manager.abort_request(cmd["rid"])
        elif cmd["op"] == "pages":
            send({"id": cmd["id"], "pages": engine.kv_pages_in_use()})
        elif cmd["op"] == "shutdown":
            break
    engine.shutdown()


# ---- client side ----------------------------------------------------------------------------
class EngineProcess:
    """An engine in a child process; ``generate`` returns an async iterator of chunks."""

    def __init__(self, proc: asyncio.subprocess.Process, server_args: dict[str, Any]) -> None:
        self.proc = proc
        self.server_args = server_args
        self._next_id = 0
        self._queues: dict[int, asyncio.Queue] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, **engine_kwargs: Any) -> "EngineProcess":
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.engine_proc", json.dumps(engine_kwargs),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, env=env, limit=1 << 24,
        )
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            hello = json.loads(line) if line else {}
        except (asyncio.TimeoutError, ValueError):
            hello = {}
        if not hello.get("ready"):
            _kill_group(proc)
            await asyncio.wait_for(proc.wait(), 10)
            raise RuntimeError(f"engine process did not start (exit code {proc.returncode})")
        return cls(proc, hello["server_args"])

    async def _read(self) -> None:
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                for q in self._queues.values():
                    q.put_nowait(None)  # the process died: wake every waiter
                return
            msg = json.loads(line)
            q = self._queues.get(msg.get("id"))
            if q is not None:
                q.put_nowait(msg)

    def _send(self, cmd: dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())

    def _new_queue(self) -> tuple[int, asyncio.Queue]:
        self._next_id += 1
        q: asyncio.Queue = asyncio.Queue()
        self._queues[self._next_id] = q
        return self._next_id, q

    async def generate(self, **kwargs: Any):
        req_id, q = self._new_queue()
        self._send({"op": "generate", "id": req_id, "kwargs": kwargs})
        try:
            while True:
                msg = await q.get()
                if msg is None:
                    raise ConnectionError("engine process exited")
                yield msg["chunk"]
                if msg["chunk"]["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            self._queues.pop(req_id, None)

    async def final(self, **kwargs: Any) -> dict[str, Any]:
        """Run one request to its end; the last chunk with cumulative output_ids."""
        ids: list[int] = []
        last: dict[str, Any] = {}
        async for chunk in self.generate(**kwargs):
            ids += chunk["output_ids"]
            last = chunk
        return {**last, "output_ids": ids}

    def abort(self, rid: str) -> None:
        self._send({"op": "abort", "rid": rid})

    async def pages_in_use(self) -> int:
        req_id, q = self._new_queue()
        self._send({"op": "pages", "id": req_id})
        try:
            msg = await asyncio.wait_for(q.get(), 10)
        finally:
            self._queues.pop(req_id, None)
        if msg is None:
            raise ConnectionError("engine process exited")
        return msg["pages"]

    def kill(self) -> None:
        _kill_group(self.proc)

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                self._send({"op": "shutdown"})
                await asyncio.wait_for(self.proc.wait(), 10)
            except (asyncio.TimeoutError, ConnectionError, BrokenPipeError):
                pass
        _kill_group(self.proc)
        await asyncio.wait_for(self.proc.wait(), 10)
        self._reader.cancel()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(_serve(json.loads(sys.argv[1])))
