"""`make install` installs the project into its environment: the worker starts from any
directory, as `python -m dynamo.sglang` does (not only from the repository's root)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_worker_starts_from_another_directory(tmp_path):
    out = subprocess.run([sys.executable, "-m", "components", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage: python -m components")
