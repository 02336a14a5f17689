"""A prefill CPU engine in its own process, driven by JSON lines on stdin (one request each):

    in : {"rid", "room", "input_ids", "sampling_params"}   or   {"quit": true}
    out: {"ready": true, "bootstrap_port": P}  once, then per request
         {"rid", "room", "t_submit", "t_chunk", "finish_reason", "prefill_end", "prefill_ms",
          "write_posted", "write_done"}   (wall-clock seconds; times from the engine's records)

Used by bench_disagg_ttft.py, which runs the decode engine in its own process as a decode worker
would. The protocol has its own copy of stdout; everything else printed goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

from benchmarks.engine_timing import TimingCapture
from benchmarks.topology import free_port


async def serve(engine, capture: TimingCapture, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        task = asyncio.create_task(one(engine, capture, cmd, host, port))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)


async def one(engine, capture: TimingCapture, cmd: dict, host: str, port: int) -> None:
    room, rid = int(cmd["room"]), str(cmd["rid"])
    t_submit = time.time()
    stream = await engine.async_generate(
        input_ids=cmd["input_ids"],
        sampling_params=cmd["sampling_params"],
        stream=True,
        bootstrap_host=host,
        bootstrap_port=port,
        bootstrap_room=room,
        rid=rid,
    )
    finish = None
    async for chunk in stream:
        finish = chunk["meta_info"]["finish_reason"]
    out = {
        "rid": rid,
        "room": room,
        "t_submit": t_submit,
        "t_chunk": time.time(),
        "finish_reason": finish,
    }
    prefill = capture.prefill.get(rid)
    if prefill is not None:
        out.update(prefill_end=prefill[0], prefill_ms=prefill[1])
    out.update(write_posted=capture.write_posted.get(room), write_done=capture.write_done.get(room))
    _reply(out)


_PROTOCOL = None  # the real stdout; fd 1 itself points at stderr (native libraries print there)


def _reply(obj: dict) -> None:
    _PROTOCOL.write(json.dumps(obj) + "\n")
    _PROTOCOL.flush()


class PrefillProcess:
    def __init__(self, model_path: str) -> None:
        self.model_path, self.port = model_path, free_port()
        self.proc = None
        self.pending: dict[str, asyncio.Future] = {}

    async def start(self, timeout_s: float = 120.0) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.prefill_proc",
            "--model-path",
            self.model_path,
            "--bootstrap-port",
            str(self.port),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line or not json.loads(line).get("ready"):
            raise RuntimeError("the prefill process did not start (see its stderr above)")
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            out = json.loads(line)
            fut = self.pending.pop(out["rid"], None)
            if fut is not None and not fut.done():
                fut.set_result(out)

    def submit(self, rid: str, room: int, ids: list[int], sampling: dict) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        cmd = {"rid": rid, "room": room, "input_ids": ids, "sampling_params": sampling}
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        return fut

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.stdin.write(b'{"quit": true}\n')
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--bootstrap-port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args()
    global _PROTOCOL
    _PROTOCOL = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="prefill %(asctime)s %(name)s: %(message)s"
    )
    capture = TimingCapture.install()
    import torch

    torch.set_num_threads(1)
    from components.engine.engine import CpuEngine

    engine = CpuEngine(
        model_path=args.model_path,
        skip_tokenizer_init=True,
        num_threads=1,
        disaggregation_mode="prefill",
        host=args.host,
        disaggregation_bootstrap_port=args.bootstrap_port,
    )
    _reply({"ready": True, "bootstrap_port": args.bootstrap_port})
    try:
        asyncio.run(serve(engine, capture, args.host, args.bootstrap_port))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
