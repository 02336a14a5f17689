"""The layout's rules, read from the source (docs/reference/modules.md):

- imports go one way, `protocol` <- `handlers` <- `components`; the CPU engine
  (`components/engine/`) imports only `protocol` and itself, never the worker, the backends,
  the handlers, Dynamo or SGLang;
- the CPU engine's folders are a one-way stack, lowest first: `kv`, `model` and `output`
  (which import one another without cycles), `core`, `disagg`, `api`, `process`; a folder
  imports none above its own level. `config.py` and `__init__.py` sit beneath the stack: every
  folder may import them, they import no folder;
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


# The CPU engine's folders by level, lowest first (docs/reference/modules.md). The modules beside
# them sit at -1: config.py, which every folder reads, and __init__.py, which imports no folder
# (importing any folder runs it first, and light modules must load without torch).
ENGINE_LEVELS = {"kv": 0, "model": 0, "output": 0, "core": 1, "disagg": 2, "api": 3, "process": 4}


def _engine_level(module: str) -> int | None:
    """Where a module sits in the CPU engine's stack; None: outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["components", "engine"] or len(parts) < 3:
        return None
    return ENGINE_LEVELS.get(parts[2], -1)


def _engine_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if _engine_level(module) is not None and parts[2] in ENGINE_LEVELS else None


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _engine_upward(path: str, module: str) -> bool:
    mine, theirs = _engine_level(_dotted(path)), _engine_level(module)
    return mine is not None and theirs is not None and theirs > mine


def _on_a_cycle(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    def reaches(start: str, goal: str, seen: frozenset[str]) -> bool:
        return any(b == goal or (b not in seen and reaches(b, goal, seen | {b}))
                   for a, b in edges if a == start)
    return sorted((a, b) for a, b in edges if reaches(b, a, frozenset({b})))


def test_the_cpu_engine_is_a_one_way_stack():
    assert _offenders(_engine_upward) == []
    sideways = set()  # imports between two folders of one level (the bottom's)
    for path in _sources():
        mine = _engine_folder(_dotted(_rel(path)))
        for module in _imports(path):
            theirs = _engine_folder(module)
            if mine and theirs and mine != theirs and ENGINE_LEVELS[mine] == ENGINE_LEVELS[theirs]:
                sideways.add((mine, theirs))
    assert _on_a_cycle(sideways) == []


@pytest.mark.parametrize("path, module, upward", [
    ("components/engine/core/loop.py", "components.engine.disagg.coordinator", True),
    ("components/engine/model/attention.py", "components.engine.core.batch", True),
    ("components/engine/config.py", "components.engine.kv.pool", True),
    ("components/engine/disagg/coordinator.py", "components.engine.core.sequence", False),
    ("components/engine/kv/pool.py", "components.engine.config", False),
    ("components/engine/model/attention.py", "components.engine.kv.pool", False),
])
def test_the_stack_rule_catches_what_it_is_for(path, module, upward):
    assert _engine_upward(path, module) is upward


def test_the_cycle_check_finds_a_cycle():
    edges = {("kv", "model"), ("model", "output"), ("output", "kv"), ("model", "config")}
    assert _on_a_cycle(edges) == [("kv", "model"), ("model", "output"), ("output", "kv")]


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
