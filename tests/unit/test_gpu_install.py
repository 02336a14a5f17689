"""The GPU install resolves to the stack Dynamo 1.6.1 ships for SGLang, nothing else.

pyproject.toml's `gpu` extra (and `sglang`, its old name) is read as pip reads it (a dry run of
`pip install --no-deps .[gpu]`, offline: the build backend's own metadata), and `make
install-gpu`'s recipe is read from the Makefile; both are checked against what the installed
ai-dynamo's METADATA pins in its own `sglang` extra (SGLang 0.5.21, NIXL 1.5.0 for 1.6.1).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "dynamo-sglang-pd"
DYNAMO_VERSION = importlib.metadata.version("ai-dynamo")
# Packages of the CUDA stack ai-dynamo's extra pins (directly or through sglang's exact pins):
# a pin of any of them beside ai-dynamo's would replace what that stack was built with.
STACK = re.compile(r"^(sglang|torch|nixl|flashinfer|sgl-kernel|sglang-kernel|cupy|cuda|nvidia|"
                   r"triton|transformers)", re.I)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def project_requires() -> list[Requirement]:
    """The project's Requires-Dist as the build backend writes it, through pip's own dry run."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
         "--no-build-isolation", "--ignore-installed", "--quiet", "--report", "-", ".[gpu]"],
        cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    [item] = json.loads(out.stdout)["install"]
    assert item["metadata"]["name"] == PROJECT
    return [Requirement(r) for r in item["metadata"]["requires_dist"]]


def _extra(requires: list[Requirement], extra: str) -> list[Requirement]:
    """An extra's requirements, with the project's references to its own extras expanded."""
    out: list[Requirement] = []
    for req in requires:
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        if _canonical(req.name) == PROJECT:
            out += [r for e in sorted(req.extras) for r in _extra(requires, e)]
        else:
            out.append(req)
    return out


def _extras(requires: list[Requirement]) -> set[str]:
    return {m for r in requires if r.marker for m in re.findall(r'extra == "([^"]+)"',
                                                                 str(r.marker))}


def _dynamo_pins(extra: str) -> dict[str, str]:
    """What the installed ai-dynamo pins in one of its extras: name -> specifier."""
    pins = {}
    for line in importlib.metadata.requires("ai-dynamo") or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}):
            pins[_canonical(req.name)] = str(req.specifier)
    return pins


def test_ai_dynamo_1_6_1_pins_sglang_0_5_21_and_nixl_1_5_0():
    """What Dynamo 1.6.1's users run (its pip extra, and its sglang-runtime image): the stack the
    GPU install must land on."""
    pins = _dynamo_pins("sglang")
    assert DYNAMO_VERSION == "1.6.1"
    assert (pins["sglang"], pins["nixl"]) == ("==0.5.21", "==1.5.0"), pins


@pytest.mark.parametrize("extra", ["gpu", "sglang"])
def test_the_gpu_extra_is_dynamos_own_sglang_stack(project_requires, extra):
    reqs = _extra(project_requires, extra)
    assert [(_canonical(r.name), sorted(r.extras), str(r.specifier)) for r in reqs] == [
        ("ai-dynamo", ["sglang"], f"=={DYNAMO_VERSION}")]


def test_no_extra_pins_another_sglang_or_a_package_of_the_gpu_stack(project_requires):
    """Only ai-dynamo names SGLang; the GPU extras name nothing of its stack. (`cpu` pins the
    CPU stack, torch and NIXL included, for `make install`: never installed beside `gpu`.)"""
    dynamo_sglang = _dynamo_pins("sglang")["sglang"]
    for extra in sorted(_extras(project_requires)):
        for req in _extra(project_requires, extra):
            if _canonical(req.name) == "sglang":
                assert str(req.specifier) == dynamo_sglang, (extra, str(req))
            if extra in ("gpu", "sglang"):
                assert not STACK.match(req.name), (extra, str(req))


def _recipe(target: str) -> list[str]:
    """The command lines of one Makefile rule, variables expanded by `make -n` itself."""
    # Run inside `make test`, make's own variables would make this a sub-make that prints
    # "Entering/Leaving directory" lines among the commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "-n", "-B", "--no-print-directory", "-f", "Makefile", target],
                         cwd=ROOT, capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_make_install_gpu_installs_dynamos_stack_then_the_project_without_deps(project_requires):
    [req] = _extra(project_requires, "gpu")
    stack = f"{req.name}[{','.join(sorted(req.extras))}]{req.specifier}"  # without the marker
    lines = [line for line in _recipe("install-gpu") if "pip install" in line]
    pins = [i for i, line in enumerate(lines) if f'"{stack}"' in line]
    project = [i for i, line in enumerate(lines) if line.split()[-2:] == ["-e", "."]]
    assert pins and project and pins[0] < project[0], lines
    assert "--no-deps" in lines[project[0]].split()
    # Everything after the stack is held to the versions it resolved (or installs no deps).
    for line in lines[pins[0] + 1:]:
        args = line.split()
        assert "--no-deps" in args or "-c" in args, line
    assert not [line for line in lines if re.search(r"\bsglang==|\bnixl==|\btorch==", line)]


def test_make_test_gpu_runs_the_gpu_tier_from_the_gpu_venv():
    lines = _recipe("test-gpu")
    assert any("pip install" in line for line in lines)  # install-gpu first
    assert lines[-1].startswith(".venv-gpu/bin/python -m pytest tests/gpu"), lines[-1]
