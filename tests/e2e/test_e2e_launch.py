"""launch/disagg.sh on the CPU engine: says ready once the model is served, serves a chat,
and on SIGTERM stops every process it started; with 2 prefill + 2 decode workers, the
frontend's prefill router gives every worker requests."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from harness.topology import REPO, free_port, wait_until
from tests.e2e.client import chat, user

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def processes_mentioning(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eww" not in line]


@pytest.mark.parametrize("workers", [(), ("--num-prefill", "2", "--num-decode", "2")],
                         ids=["1+1", "2+2"])
def test_disagg_script_serves_and_cleans_up(tmp_path, tiny_model_path, workers):
    port, bootstrap = free_port(), free_port()
    log = tmp_path / "launch.log"
    env = dict(os.environ, LOG_DIR=str(tmp_path / "logs"), OMP_NUM_THREADS="1")
    env.pop("DYN_FILE_KV", None)
    with open(log, "wb") as out:
        script = subprocess.Popen(
            [str(REPO / "launch" / "disagg.sh"), "--cpu", "--model", tiny_model_path,
             "--served-model-name", "tiny", "--http-port", str(port),
             "--bootstrap-port", str(bootstrap), *workers, "--", "--max-total-tokens", "8192",
             "--cpu-num-threads", "1"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: script.poll() is None and "ready: model tiny" in log.read_text()
                   or script.poll() is not None, 180, "the script to say ready")
        assert script.poll() is None, log.read_text()
        # "ready" means the model answered once; the other workers may still be registering.
        def all_ready() -> bool:
            logs = [p for p in (tmp_path / "logs").glob("*.log") if p.stem != "frontend"]
            return len(logs) == (4 if workers else 2) and all(
                "worker ready" in p.read_text() for p in logs)

        wait_until(all_ready, 60, "every worker ready")
        with httpx.Client(timeout=60) as http:
            for i in range(8):
                out = chat(http, f"http://127.0.0.1:{port}",
                           {"model": "tiny", "messages": user(f"hi {i}"), "max_tokens": 3})
                assert out["usage"]["completion_tokens"] == 3
        served = {log.stem: log.read_text().count(" done: ")
                  for log in (tmp_path / "logs").glob("*.log") if log.stem != "frontend"}
        assert len(served) == (4 if workers else 2) and all(served.values()), served
        assert processes_mentioning(str(bootstrap)), "workers not found by their bootstrap port"
        script.send_signal(signal.SIGTERM)
        script.wait(60)
        wait_until(lambda: not processes_mentioning(str(bootstrap))
                   and not processes_mentioning(f"--http-port {port}"), 30,
                   "every started process to exit")
        assert "stopped" in log.read_text()
    finally:
        if script.poll() is None:  # let the script's trap stop its process groups
            script.send_signal(signal.SIGTERM)
            try:
                script.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(script.pid, signal.SIGKILL)
        for marker in (str(bootstrap), f"--http-port {port}"):
            for line in processes_mentioning(marker):
                os.kill(int(line.split()[0]), signal.SIGKILL)
