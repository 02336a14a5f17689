"""The layout's rules, read from the source (docs/reference/modules.md):

- imports go one way, `protocol` <- `handlers` <- `components`; the CPU engine
  (`components/engine/`) imports only `protocol` and itself, never the worker, the backends,
  the handlers, Dynamo or SGLang;
- only the worker (`components/worker/`) imports `dynamo`, and only the SGLang backend's own
  modules (`components/backends/sglang_*.py`) import `sglang`;
- which engine runs and who orchestrates are decided once (`components/backends/select.py`,
  `components/worker/role.py`): no other module compares them as strings, and only role.py
  derives the `Orchestration` both handlers get (`handlers/disagg/orchestration.py`): every
  other module only compares a value it was handed with its members.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "handlers", "components")


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _offenders(rule) -> list[str]:
    return [f"{_rel(p)} imports {m}" for p in _sources() for m in sorted(_imports(p))
            if rule(_rel(p), m)]


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_imports_go_one_way():
    def upward(path: str, module: str) -> bool:
        if path.startswith("protocol/"):
            return _under(module, "handlers", "components")
        if path.startswith("handlers/"):
            return _under(module, "components")
        return False
    assert _offenders(upward) == []


def test_the_cpu_engine_imports_only_protocol_and_itself():
    def leaves(path: str, module: str) -> bool:
        return path.startswith("components/engine/") and _under(
            module, "handlers", "dynamo", "sglang", "components.worker", "components.backends",
            "components.model_builder")
    assert _offenders(leaves) == []


def test_only_the_worker_imports_dynamo():
    assert _offenders(lambda path, module: _under(module, "dynamo")
                      and not path.startswith("components/worker/")) == []


def test_only_the_sglang_backend_imports_sglang():
    allowed = re.compile(r"components/backends/sglang_[a-z_]+\.py")
    assert _offenders(lambda path, module: _under(module, "sglang")
                      and not allowed.fullmatch(path)) == []


# `kind == "sglang"`, `"cpu" != x`, `orchestrator in ("frontend", ...)`
KIND_COMPARE = re.compile(
    r"""(==|!=|\bis\b|\bin\b)\s*\(?\s*["'](sglang|cpu|frontend|decode)["']"""
    r"""|["'](sglang|cpu|frontend|decode)["']\s*(==|!=|\bin\b)""")
DECIDED_IN = ("components/backends/", "components/worker/role.py")


def test_engine_kind_and_orchestrator_are_decided_in_one_place():
    hits = [f"{_rel(p)}:{n}: {line.strip()}" for p in _sources()
            if not _rel(p).startswith(DECIDED_IN)
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if KIND_COMPARE.search(line.split("#")[0])]
    assert hits == []


@pytest.mark.parametrize("line", ['if kind == "sglang":', "elif 'cpu' != kind:",
                                  'if style in ("frontend", "decode"):'])
def test_the_compare_pattern_catches_what_it_is_for(line):
    assert KIND_COMPARE.search(line)


ORCHESTRATION_HOME = ("components/worker/role.py", "handlers/disagg/orchestration.py")


def _orchestration_derivations(source: str) -> list[str]:
    """`Orchestration(...)` calls and `Orchestration.X` members used other than as the right
    side of a comparison (`style is Orchestration.DECODE` reads; `orchestration=Orchestration.
    DECODE` picks one)."""
    tree = ast.parse(source)
    compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for c in node.comparators}
    hits = []
    for node in ast.walk(tree):
        named = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                 and node.value.id == "Orchestration")
        called = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "Orchestration")
        if called or (named and id(node) not in compared):
            hits.append(f"{node.lineno}: {ast.unparse(node)}")
    return hits


def test_only_the_role_derives_the_orchestration():
    assert [f"{_rel(p)}:{hit}" for p in _sources() if _rel(p) not in ORCHESTRATION_HOME
            for hit in _orchestration_derivations(p.read_text())] == []


def test_the_orchestration_rule_catches_a_derivation():
    source = ("cfg = Config(orchestration=Orchestration.DECODE)\n"
              "style = Orchestration(flag)\n"
              "calls = style is Orchestration.DECODE\n")
    assert sorted(_orchestration_derivations(source)) == [
        "1: Orchestration.DECODE", "2: Orchestration(flag)"]
