"""What every benchmark shares: statistics, the printed table, JSON + PNG output, machine facts.

Each benchmark reports the median of several runs and states its result as a ratio against a
baseline measured in the same run; these helpers keep that uniform across scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO_ROOT / "results"
SMALL_MODEL = REPO_ROOT / ".cache" / "models" / "small-seed0"
TINY_MODEL = REPO_ROOT / ".cache" / "models" / "tiny-seed0"
# Taken when a benchmark starts (it imports this module first): the load it started under.
_STARTED = (time.strftime("%Y-%m-%dT%H:%M:%S%z"), round(os.getloadavg()[0], 2))


def limit_cpu_threads(n: int = 1) -> None:
    """One intra-op thread: the machine has 2 cores shared by every process of a topology."""
    import torch

    torch.set_num_threads(n)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Iterable[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def median_of_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-key median over runs of flat metric dicts (numeric keys only; others from run 0)."""
    if not runs:
        return {}
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            out[key] = median(float(r[key]) for r in runs if key in r)
        else:
            out[key] = first
    return out


def ratio(value: float, baseline: float) -> float:
    if not baseline or baseline != baseline or value != value:
        return float("nan")
    return value / baseline


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """A Markdown table (readable in a terminal, pasteable into docs/benchmarks.md)."""
    cells = [[fmt(c, digits) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join([line, sep, *body])


def machine_info() -> dict[str, Any]:
    """Facts a reader needs to judge the numbers (CPU, load at start, library versions)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m_at_start": _STARTED[1],
        "time": _STARTED[0],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("torch", "transformers", "tokenizers", "nixl", "ai-dynamo", "ai-dynamo-runtime"):
        try:
            info[dist] = version(dist)
        except PackageNotFoundError:
            info[dist] = None
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def results_dir(path: str | Path | None = None) -> Path:
    out = Path(path or os.environ.get("BENCH_RESULTS", DEFAULT_RESULTS))
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_json(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    path = out_dir / f"{name}.json"
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(_clean(payload), indent=2, allow_nan=False) + "\n")
    return path


def _clean(value: Any) -> Any:
    """Strict JSON: NaN -> null, paths and tuples -> plain types."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def new_figure(ncols: int = 1, width: float = 6.0, height: float = 4.0):
    """A matplotlib figure on the Agg backend (no display on a server)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, out_dir: Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def require_model(path: Path, size: str) -> Path:
    """Build the project's model if missing (deterministic; seconds). The lock file is the one
    tests/support/models.py takes, so a test session and a benchmark never build the same dir twice."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "build_info.json").exists():
            from components.model_builder import build_model_dir

            build_model_dir(path, size, 0)
    return path


def engine_bench_parser(doc: str, runs: int) -> argparse.ArgumentParser:
    """The flags every in-process CPU-engine benchmark takes (model, runs, threads, out)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model", default=str(SMALL_MODEL))
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", default=None, help="results directory")
    return parser


def parse_engine_bench_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    args = parser.parse_args()
    if args.model == str(SMALL_MODEL):
        require_model(SMALL_MODEL, "small")
    return args
