"""The project's test models, built once per machine into .cache/models (a lock keeps
concurrent test sessions from building the same directory twice)."""

import fcntl
from pathlib import Path

from components.model_builder import build_model_dir

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"


def model_path(size: str, seed: int = 0, chat_template: str = "chatml") -> Path:
    """`chat_template` qwen3: the same weights with Qwen3's tools and thinking template."""
    variant = "" if chat_template == "chatml" else f"-{chat_template}"
    name = f"{size}{variant}-seed{seed}"
    out = CACHE / name
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "build_info.json").exists():
            build_model_dir(out, size, seed, chat_template)
    return out
