"""CPU time of whole process trees (a worker and every process it spawned, such as SGLang's
scheduler), sampled in the background so that a window known only afterwards (the start and end
of an external load generator's measured phase) can be cut out of the series.

CPU per thread comes from /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU; `stat`'s ticks
are 10 ms, too coarse for a few seconds of load). Children are found by scanning /proc/*/stat for
their parent pid: this kernel has no /proc/<pid>/task/<tid>/children. A thread or child that exits
between two samples loses its share; the workers and their schedulers live for the whole run.
"""

from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path

PROC = Path("/proc")


def _parents() -> dict[int, int]:
    """pid -> parent pid for every live process."""
    out: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # exited meanwhile
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(roots: list[int], parents: dict[int, int] | None = None) -> list[int]:
    """The roots and every live process below them."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def process_cpu_s(pid: int) -> float:
    """CPU seconds so far of every live thread of `pid` (0 if it is gone)."""
    total = 0
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e9


def cpu_between(samples: list[tuple[float, float]], t0: float, t1: float) -> float:
    """CPU seconds spent between wall times t0 and t1, linearly interpolated in a series of
    (wall time, cumulative CPU seconds) samples sorted by time."""
    return _at(samples, t1) - _at(samples, t0)


def _at(samples: list[tuple[float, float]], t: float) -> float:
    if not samples:
        raise ValueError("no CPU samples")
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return samples[0][1]
    if i == len(samples):
        return samples[-1][1]
    (ta, ca), (tb, cb) = samples[i - 1], samples[i]
    return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else cb


class TreeCpuRecorder:
    """Samples the trees under `roots` every `interval_s` in a thread: with `with` around a run,
    `samples` holds (time.time(), cumulative CPU seconds) pairs covering it, `root_samples[pid]`
    the same for each root process alone. The trees are listed once, on entry (a scan of /proc
    per sample would cost more CPU than the sample itself)."""

    def __init__(self, roots: list[int], interval_s: float = 0.1) -> None:
        self.roots, self.interval_s = roots, interval_s
        self.pids: list[int] = []
        self.samples: list[tuple[float, float]] = []
        # Each root process alone (without its children), sampled with the trees.
        self.root_samples: dict[int, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)

    def _sample(self) -> None:
        per = {pid: process_cpu_s(pid) for pid in self.pids}
        now = time.time()
        self.samples.append((now, sum(per.values())))
        for pid in self.roots:
            self.root_samples.setdefault(pid, []).append((now, per.get(pid, 0.0)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> TreeCpuRecorder:
        self.pids = descendants(self.roots)
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
