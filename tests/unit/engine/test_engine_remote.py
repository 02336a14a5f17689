"""The CPU engine in a process of its own (``--cpu-engine-process separate``): the worker's
``RemoteCpuEngine`` against a real engine process started by ``CpuBackend.build``.

Checked: the in-process engine's tokens, read-outs that already count a request when its final
chunk arrives, KV events forwarded to the worker's listener, refusals raise ``ValueError``, a
closed stream frees its pages, a failed start names the exit code, a dead engine process ends
live requests, and an engine process whose worker dies exits.
"""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
import pytest_asyncio

from components.backends import cpu_flags
from components.backends.cpu import CpuBackend
from components.engine.process.engine import CpuEngine
from components.engine.process import wire
from components.engine.process.launch import EngineProcessFailed, start_engine_process
from tests.support.engine_helpers import drain, random_prompt

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

GREEDY = {"temperature": 0.0, "max_new_tokens": 12}
LONG = {"temperature": 0.0, "max_new_tokens": 1500, "ignore_eos": True}
DEADLINE_S = 20.0
ARGS = {"skip_tokenizer_init": True, "max_total_tokens": 4096, "context_length": 2048}


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def blocks_stored(self, *args): self.calls.append(("blocks_stored", args))
    def blocks_removed(self, *args): self.calls.append(("blocks_removed", args))
    def load(self, *args): self.calls.append(("load", args))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def remote(tiny_model_path):
    eng = CpuBackend().build({"model_path": tiny_model_path, **ARGS,
                              cpu_flags.ENGINE_PROCESS_KEY: cpu_flags.SEPARATE})
    yield eng
    eng.shutdown()
    assert eng.engine_process.returncode == 0


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_registration_facts_come_from_the_engine_process(remote, tiny_model_path):
    assert remote.engine_process.pid != os.getpid()
    assert remote.page_size == 16 and remote.context_length == 2048
    assert remote.kv_pages_total() == 4096 // 16
    assert remote.get_server_info()["max_total_num_tokens"] == 4096


async def test_same_tokens_as_in_process_and_readouts_count_the_request(remote, tiny_model_path):
    ids = random_prompt(40, remote.vocab_size, seed=1)
    with CpuEngine(model_path=tiny_model_path, **ARGS) as local:
        direct = await local.async_generate(input_ids=ids, sampling_params=GREEDY)
    before = remote.request_totals()
    chunks = await drain(await remote.async_generate(input_ids=ids, sampling_params=GREEDY,
                                                     stream=True))
    assert sum((c["output_ids"] for c in chunks), []) == direct["output_ids"]
    # Pushed ahead of the final chunk: no wait, no round trip.
    after = remote.request_totals()
    assert after.requests == before.requests + 1
    assert after.generation_tokens == before.generation_tokens + len(direct["output_ids"])
    await until(lambda: remote.kv_pages_in_use() == 0 and remote.requests_in_flight() == 0,
                "pages and requests back to 0")


async def test_kv_events_reach_the_listener_in_this_process(remote):
    listener = Listener()
    remote.set_kv_event_listener(listener)
    ids = random_prompt(64, remote.vocab_size, seed=2)  # 4 whole pages
    await remote.async_generate(input_ids=ids, sampling_params=GREEDY)
    await until(lambda: any(n == "blocks_stored" for n, _ in listener.calls), "blocks_stored")
    stored = [a for n, a in listener.calls if n == "blocks_stored"]
    assert stored[0][0] == ids[:len(stored[0][1]) * 16] and stored[0][2] is None
    await until(lambda: listener.calls[-1] == ("load", (0, 0, 0)), "load back to idle")
    assert remote.prefix_hit_tokens() >= 0 and remote.kv_pages_cached() >= 4


async def test_refusals_raise_value_error(remote):
    with pytest.raises(ValueError, match="temperature"):
        await remote.async_generate(input_ids=[1, 2], sampling_params={"temperature": -1.0})
    stream = await remote.async_generate(input_ids=[1, 2], stream=True,
                                         sampling_params={"temperature": -1.0})
    with pytest.raises(ValueError, match="temperature"):
        await drain(stream)


async def test_a_closed_stream_aborts_in_the_engine_process(remote):
    stream = await remote.async_generate(input_ids=[3, 4, 5], sampling_params=LONG, stream=True)
    await stream.__anext__()
    await until(lambda: remote.kv_pages_in_use() > 0, "pages in use")
    await stream.aclose()
    await until(lambda: remote.kv_pages_in_use() == 0 and remote.requests_in_flight() == 0,
                "the aborted request's pages freed")


async def test_a_failed_start_names_the_exit_code(tmp_path):
    started = time.monotonic()
    with pytest.raises(EngineProcessFailed, match="exited with code 1 before it was ready"):
        await asyncio.to_thread(start_engine_process, {"model_path": str(tmp_path / "none")})
    assert time.monotonic() - started < 60


async def test_a_dead_engine_process_ends_live_requests(tiny_model_path):
    eng = CpuBackend().build({"model_path": tiny_model_path, **ARGS,
                              cpu_flags.ENGINE_PROCESS_KEY: cpu_flags.SEPARATE})
    try:
        stream = await eng.async_generate(input_ids=[3, 4, 5], sampling_params=LONG, stream=True)
        await stream.__anext__()
        eng.engine_process.kill()
        eng.engine_process.wait(DEADLINE_S)
        assert eng.end_all() == 1  # what the worker's pidfd watch calls
        chunks = await asyncio.wait_for(drain(stream), DEADLINE_S)
        reason = chunks[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 503
        with pytest.raises(RuntimeError, match="engine process exited"):
            await eng.async_generate(input_ids=[1], sampling_params=GREEDY)
    finally:
        eng.shutdown()


async def test_an_engine_process_exits_when_its_worker_is_killed(tiny_model_path):
    script = (
        "import sys\n"
        "from components.engine.process.launch import start_engine_process\n"
        f"p = start_engine_process({{'model_path': {tiny_model_path!r}}})\n"
        "print(p.pid, flush=True)\n"
        "sys.stdin.read()\n")
    worker = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 120)
        engine_pid = int(line)
        assert wire.process_alive(engine_pid)
        worker.send_signal(signal.SIGKILL)
        worker.wait(DEADLINE_S)
        await until(lambda: not wire.process_alive(engine_pid),
                    "the engine process to exit after its worker")
    finally:
        worker.kill()
        worker.wait(DEADLINE_S)
