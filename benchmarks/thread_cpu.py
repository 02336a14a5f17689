"""CPU time per thread of running processes, from Linux's /proc/<pid>/task/<tid>/schedstat.

`schedstat`'s first field is the thread's time on a CPU in nanoseconds (`stat`'s utime/stime
tick at 10 ms, too coarse for a few seconds of load). A thread that exits between two samples
loses its share; the workers and the frontend keep their threads for the whole run.

Threads are grouped by role:
- `loop`: the process's main thread (the worker's asyncio event loop, `asyncio.run` in main);
- `engine`: the CPU engine's thread (named `cpu-engine`);
- `bridge`: every other thread (Dynamo's Rust runtime: tokio workers, the request plane's
  and the Python bridge's threads; torch/OpenMP helpers would land here too).
"""

from __future__ import annotations

from pathlib import Path

ENGINE_THREAD = "cpu-engine"


def _thread_ns(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (name, CPU ns so far) for every live thread of `pid`."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread exited meanwhile
            continue
        out[int(task.name)] = (name, ns)
    return out


def role(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return "loop"
    if name == ENGINE_THREAD:
        return "engine"
    return "bridge"


class CpuSampler:
    """`start()` then `stop()` -> {process: {role: CPU seconds}} over the window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._before: dict[str, dict[int, tuple[str, int]]] = {}
        self.by_name: dict[str, dict[str, float]] = {}  # the last window, by thread name

    def start(self) -> None:
        self._before = {proc: _thread_ns(pid) for proc, pid in self.pids.items()}

    def stop(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for proc, pid in self.pids.items():
            before = self._before.get(proc, {})
            groups: dict[str, float] = {}
            names: dict[str, float] = {}
            for tid, (name, ns) in _thread_ns(pid).items():
                used = (ns - before.get(tid, (name, 0))[1]) / 1e9
                key = role(pid, tid, name)
                groups[key] = groups.get(key, 0.0) + used
                names[name] = names.get(name, 0.0) + used
            out[proc] = groups
            self.by_name[proc] = names
        return out
