"""Which tests must run in one pytest-xdist worker (`make test` runs the suite in two).

A module's tests share its module-scoped fixtures (its stacks), and the modules that share a
standard stack by key (`tests/support/shared_stacks.py`) share it only within one process. So a
group is a module, joined with every other module one of its tests shares a stack key with, and
`GroupScheduling` sends each group whole to one worker, which runs it in the suite's order.
Groups run side by side: one process alone leaves a core idle while its tests wait for processes
to start and for bounds to pass.

The keys are known only after collection, which happens in the workers: each worker writes the
groups it computed (the same in every worker) next to its base directory (`write_groups`), and
the scheduler in the controlling process reads them once every worker has collected. xdist's own
`--dist loadgroup` cannot be used: it renames test ids, which pytest 9.2 no longer allows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.shared_stacks import key_of

GROUPS_FILE = "xdist-groups.json"


def _root(parent: dict[str, str], node: str) -> str:
    while parent.setdefault(node, node) != node:
        parent[node] = parent[parent[node]]
        node = parent[node]
    return node


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_names(items: list[Any]) -> list[str]:
    """Each item's group: its module, merged with the modules sharing any of its stack keys
    (named after the first such module)."""
    parent: dict[str, str] = {}
    modules = [module_of(item.nodeid) for item in items]
    for module, item in zip(modules, items):
        key = key_of(item)
        root = _root(parent, module)
        if key is not None:
            other = _root(parent, f"key:{key!r}")
            if other.startswith("key:"):  # the key's first user: it joins this module
                parent[other] = root
            elif other != root:  # an earlier module's group: this module joins it
                parent[root] = other
    return [_root(parent, module) for module in modules]


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (after `order_items`): the groups, for the controller's scheduler."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or config.option.basetemp is None:
        return
    path = Path(config.option.basetemp).parent / GROUPS_FILE
    tmp = path.with_name(f"{GROUPS_FILE}.{worker}")
    tmp.write_text(json.dumps(dict(zip((i.nodeid for i in items), group_names(items)))))
    os.replace(tmp, path)  # every worker writes the same; a reader sees one whole file


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For `--dist loadscope`: a group as the scope, the groups in the suite's order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: Optional[dict[str, str]] = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # asked only once every worker's collection is in
                path = config._tmp_path_factory.getbasetemp() / GROUPS_FILE
                self.groups = json.loads(path.read_text())
            return self.groups.get(nodeid, module_of(nodeid))

    config.option.loadscopereorder = False  # the suite's order: end-to-end groups first
    return GroupScheduling(config, log)
