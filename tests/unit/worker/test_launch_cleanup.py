"""launch/common.sh's cleanup signals each started process, not its whole process group: a worker
must drain while its engine's subprocesses (same group) still run; stragglers are killed after."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

COMMON = Path(__file__).resolve().parents[3] / "launch" / "common.sh"

# A "worker" with an engine subprocess in its process group: the subprocess records a SIGTERM;
# the worker, on SIGTERM, records whether its subprocess is still alive while it drains.
WORKER = r"""
( trap 'echo engine-got-term >> "$OUT"' TERM; while :; do sleep 0.05; done ) &
ENGINE_PID=$!
trap 'kill -0 $ENGINE_PID && echo engine-alive-during-drain >> "$OUT"; exit 0' TERM
echo $ENGINE_PID > "$OUT.engine"
while :; do sleep 0.05; done
"""

DRIVER = r"""
source "$COMMON"
start worker bash -c "$WORKER"
for _ in $(seq 200); do [[ -s "$OUT.engine" ]] && break; sleep 0.05; done
cleanup
"""


def test_cleanup_lets_the_worker_drain_before_its_group_goes(tmp_path):
    out = tmp_path / "events"
    env = {"PATH": "/usr/bin:/bin", "COMMON": str(COMMON), "WORKER": WORKER, "OUT": str(out),
           "STOP_TIMEOUT": "5"}
    done = subprocess.run(["bash", "-c", DRIVER], env=env, capture_output=True, text=True,
                          timeout=40)
    assert done.returncode == 0, done.stderr
    events = out.read_text().split()
    assert "engine-alive-during-drain" in events
    assert "engine-got-term" not in events  # only the worker itself was signalled
    engine_pid = int((tmp_path / "events.engine").read_text())
    deadline = time.monotonic() + 5
    while running(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(engine_pid), "the engine subprocess outlived cleanup"


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait to be reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
