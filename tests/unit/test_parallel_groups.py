"""The groups `make test`'s two pytest-xdist workers split the suite by
(tests/support/parallel_groups.py): a module's tests stay together, and modules that share a
stack key are one group, so no stack starts twice and no module fixture runs in both workers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import pytest

from harness.topology import _worker_range
from tests.support.parallel_groups import group_names
from tests.support.shared_stacks import STASH_KEY, TEXT, TOKENS, StackKey


def item(nodeid: str, key: Optional[StackKey] = None) -> Any:
    stash = pytest.Stash()
    stash[STASH_KEY] = key
    return SimpleNamespace(nodeid=nodeid, stash=stash)


def test_modules_sharing_a_key_are_one_group_and_the_others_their_own():
    items = [item("a.py::t1", TOKENS), item("b.py::t1", TOKENS), item("b.py::t2"),
             item("c.py::t1"), item("d.py::t1", TEXT), item("e.py::t1", TEXT),
             item("e.py::t2", TOKENS), item("f.py::t1[x]"), item("f.py::t2[y]")]
    names = group_names(items)
    # a, b (TOKENS) and d, e (TEXT) join through e's TOKENS test: one group of four modules.
    assert len({names[i] for i in (0, 1, 2, 4, 5, 6)}) == 1
    assert names[0] in {"a.py", "b.py", "d.py", "e.py"}
    assert names[3] == "c.py" and names[7] == names[8] == "f.py"


def test_the_groups_are_the_same_in_every_worker():
    def items() -> list[Any]:
        return [item("a.py::t", TEXT), item("b.py::t"), item("c.py::t", TEXT)]
    assert group_names(items()) == group_names(items()) == ["a.py", "b.py", "a.py"]


def test_each_worker_hands_out_ports_from_its_own_share():
    assert _worker_range(10000, 21999, "", "") == (10000, 21999)  # not under xdist
    first, second = (_worker_range(10000, 21999, f"gw{i}", "2") for i in range(2))
    assert first == (10000, 15999) and second == (16000, 21999)
