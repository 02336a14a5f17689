"""The suite's shared stacks (tests/support/shared_stacks.py) on stand-in stacks: one alive at a
time, reused by key, stopped when the next test needs another; a leak fails the release naming
what is held; and the ordering that runs each key's tests together."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from tests.support.shared_stacks import (
    TEXT, TOKENS, TOKENS_FRONTEND, SharedStacks, StackKey, key_of, order_items,
)


class FakeProc:
    def __init__(self, name: str, system_port: Optional[int]) -> None:
        self.name, self.system_port = name, system_port
        self.in_flight, self.pages = 0, 0
        self.popen = SimpleNamespace(returncode=None)

    def alive(self) -> bool:
        return True

    def engine_route(self, name: str) -> dict[str, Any]:
        if name == "requests":
            return {"in_flight": self.in_flight, "rids": ["r1"] * self.in_flight}
        return {"pages_in_use": self.pages}


class FakeStack:
    def __init__(self, key: StackKey) -> None:
        self.key, self.stopped = key, False
        self.workdir = Path(key.name)
        self.procs = {"frontend": FakeProc("frontend", None), "decode": FakeProc("decode", 1)}

    def check_alive(self) -> None:
        assert not self.stopped

    def stop(self) -> None:
        self.stopped = True


def pool() -> tuple[SharedStacks, list[FakeStack]]:
    started: list[FakeStack] = []

    def start(key: StackKey, services: Any) -> Any:
        started.append(FakeStack(key))
        return started[-1]

    return SharedStacks(start, idle_timeout=0.5), started


def test_a_key_is_reused_and_another_key_stops_it_first():
    stacks, started = pool()
    first = stacks.acquire(TOKENS, None, "a")
    stacks.release(TOKENS, keep=True)
    assert stacks.acquire(TOKENS, None, "b") is first and len(started) == 1
    second = stacks.acquire(TEXT, None, "c")
    assert first.stopped and not second.stopped and stacks.starts == 2
    stacks.release(TEXT, keep=False)
    assert second.stopped and stacks.stack is None


def test_a_leak_fails_the_release_naming_it_and_the_next_user_starts_clean():
    stacks, started = pool()
    stack = stacks.acquire(TOKENS, None, "tests/e2e/test_x.py")
    stack.procs["decode"].in_flight, stack.procs["decode"].pages = 1, 3
    with pytest.raises(AssertionError) as failed:
        stacks.release(TOKENS, keep=True)
    message = str(failed.value)
    assert "tests/e2e/test_x.py" in message and "1 requests in flight" in message
    assert "3 KV pages in use" in message and "r1" in message
    assert stack.stopped
    assert stacks.acquire(TOKENS, None, "next") is not stack and len(started) == 2


def item(params: dict, module: Any = None) -> Any:
    return SimpleNamespace(callspec=SimpleNamespace(params=params), module=module,
                           stash=pytest.Stash())


def test_ordering_groups_each_key_where_the_first_keyed_test_was():
    declared = SimpleNamespace(SHARED_STACK=lambda params: TEXT if params["mode"] == "text"
                               else TOKENS)
    items = [item({"x": 1}),                                   # 0: none, before any key
             item({"stack": TOKENS}),                          # 1
             item({"stack": TOKENS_FRONTEND}),                 # 2
             item({"x": 2}),                                   # 3: none
             item({"mode": "text"}, declared),                 # 4
             item({"stack": TOKENS}),                          # 5
             item({"mode": "tokens"}, declared)]               # 6
    names = {id(it): i for i, it in enumerate(items)}
    order_items(items)
    assert [names[id(it)] for it in items] == [0, 1, 5, 6, 2, 4, 3]
    assert [key_of(it) for it in items] == [None, TOKENS, TOKENS, TOKENS, TOKENS_FRONTEND, TEXT,
                                            None]
    assert key_of(None) is None
