"""protocol/ and handlers/ import none of dynamo, sglang, torch (checked in a fresh
interpreter, so other tests' imports cannot hide a leak), and resolve to this checkout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("dynamo", "sglang", "torch", "transformers", "tokenizers", "nixl")

PROBE = """
import json, sys
import protocol, handlers
import handlers.decode, handlers.prefill, handlers.text.preprocess, handlers.core.sampling
import protocol.chat, protocol.disagg, protocol.outputs, protocol.preprocessed
roots = sorted({m.split('.')[0] for m in sys.modules})
print(json.dumps({"roots": roots, "files": [protocol.__file__, handlers.__file__]}))
"""


@pytest.mark.timeout(60)
def test_protocol_and_handlers_import_no_heavy_runtime():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    leaked = sorted(set(report["roots"]) & set(FORBIDDEN))
    assert leaked == [], f"importing protocol/handlers pulled in {leaked}"
    for f in report["files"]:
        assert Path(f).resolve().is_relative_to(ROOT), f


def test_no_shadowing_package_folders():
    hits = []
    for top, dirs, _ in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .venv, .git, .cache
        hits += [os.path.join(top, d) for d in dirs if d in ("dynamo", "sglang")]
    assert hits == [], f"folders that would shadow the real packages: {hits}"
