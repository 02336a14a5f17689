"""A process that does nothing but run an asyncio loop with the worker's loop-lag sampler
(components/worker/metrics/loop_lag.py), always sampling: what the operating system alone gives an idle event loop while the
machine is loaded. A benchmark starts it, writes `mark` lines to its stdin and reads back, for
each, the largest lag (ms) since the previous mark.

    python -m benchmarks.lag_probe        # then type: mark
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

from components.worker.metrics.loop_lag import LoopLagMonitor


class LagProbe:
    """The benchmark's side: start the probe process, `mark()` -> max lag (ms) since the last."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.lag_probe"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.mark()  # answers once its loop runs: the probe is ready

    def mark(self) -> float:
        self._proc.stdin.write("mark\n")
        self._proc.stdin.flush()
        return float(self._proc.stdout.readline())

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(10)


async def serve() -> None:
    loop, worst = asyncio.get_running_loop(), [0.0]
    lines: asyncio.Queue = asyncio.Queue()
    monitor = LoopLagMonitor(lambda lag: worst.__setitem__(0, max(worst[0], lag)))
    monitor.request_started()  # a probe, not a worker: sample as a busy worker does
    monitor.start()

    def read() -> None:  # stdin on a thread: the loop itself only ticks
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.strip())
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    while (line := await lines.get()) is not None:
        if line == "mark":
            print(f"{worst[0] * 1e3:.3f}", flush=True)
            worst[0] = 0.0
    await monitor.stop()


if __name__ == "__main__":
    asyncio.run(serve())
