"""Standard topologies shared across test modules, one alive at a time.

A `StackKey` names everything that defines a standard topology (`start_topology`'s arguments but
the directory and the model). Modules that only send requests get their stack from the session's
`SharedStacks` by key: a module finding the stack of its key already running reuses it; asking
for another key stops the running one first, so one set of processes is alive at a time. The
suite orders its tests so that the users of a key run one after another (`order_items`, from
`tests/conftest.py`), and stops a stack as soon as the next test does not use its key.

Sharing must not hide a leak: when a module (or one block of a module's tests, after reordering)
is done with a stack, every worker of it must come back to no request in flight and no KV page in
use within a bounded time, or that module's teardown fails naming what was left (`assert_idle`).
Modules that kill, restart or reconfigure a process, or that need counters from zero, start
stacks of their own (`tests/conftest.py`'s `start_stack`), never these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Optional

import pytest

from harness.services import Services
from harness.topology import Stack, wait_until
from tests.support.structured_schemas import WHITESPACE_ARGS
from tests.support.topologies import DECODE_ORCHESTRATED, FRONTEND_ORCHESTRATED

IDLE_TIMEOUT_S = 30.0  # an aborted request's pages are freed within seconds; the box is busy


@dataclass(frozen=True)
class StackKey:
    """The arguments of `start_topology` that define a topology; `discovery` is "file" (a
    directory + TCP) or "etcd" (the session's etcd + NATS, `tests/conftest.py`'s etcd_nats)."""

    skip_tokenizer_init: bool
    orchestrator: str = DECODE_ORCHESTRATED
    discovery: str = "file"
    with_agg: bool = True
    prefill_args: tuple[str, ...] = ()
    worker_args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        mode = "tokens" if self.skip_tokenizer_init else "text"
        return f"shared-{mode}-{self.orchestrator}-{self.discovery}"


# The keys the suite shares. Every one caps JSON whitespace in constrained output
# (--constrained-json-max-whitespace-cnt 1, which the structured-output and peer tests need so the
# random model's JSON ends): the engine reads it only when it compiles a JSON-schema or
# structural-tag grammar (components/engine/output/grammar.py) and a Text-mode worker's native
# tool-call parsers (not enabled here), so a request without structured output is served exactly
# as without it.
TOKENS = StackKey(True, worker_args=WHITESPACE_ARGS)
TOKENS_FRONTEND = StackKey(True, FRONTEND_ORCHESTRATED, worker_args=WHITESPACE_ARGS)
TOKENS_ETCD = StackKey(True, discovery="etcd", worker_args=WHITESPACE_ARGS)
TOKENS_FRONTEND_ETCD = StackKey(True, FRONTEND_ORCHESTRATED, "etcd", worker_args=WHITESPACE_ARGS)
TEXT = StackKey(False, worker_args=WHITESPACE_ARGS)


def leftovers(stack: Stack) -> list[str]:
    """What the stack's workers still hold: requests in flight (with their rids) and KV pages in
    use (the CPU engine; None elsewhere), and workers that exited."""
    held = []
    for proc in stack.procs.values():
        if proc.system_port is None:  # the frontend
            continue
        if not proc.alive():
            held.append(f"{proc.name} exited with {proc.popen.returncode}")
            continue
        requests = proc.engine_route("requests")
        if requests["in_flight"]:
            held.append(f"{proc.name}: {requests['in_flight']} requests in flight "
                        f"(rids {requests['rids']})")
        pages = proc.engine_route("kv_pages")["pages_in_use"]
        if pages:
            held.append(f"{proc.name}: {pages} KV pages in use")
    return held


def assert_idle(stack: Stack, who: str, timeout: float = IDLE_TIMEOUT_S) -> None:
    """Every worker of `stack` back to no request and no KV page within `timeout` s, else an
    AssertionError naming what is held (and by whom: `who` is the module that was using it)."""
    last: list[list[str]] = [[]]

    def idle() -> bool:
        last[0] = leftovers(stack)
        return not last[0]

    try:
        wait_until(idle, timeout, "idle")
    except TimeoutError:
        raise AssertionError(f"{who} left the shared stack {stack.workdir.name} holding, "
                             f"{timeout:.0f}s after its last test: " + "; ".join(last[0]))


class SharedStacks:
    """The session's shared stacks: at most one alive, started in a fresh directory from
    `start(key, services)` on first use of its key."""

    def __init__(self, start: Callable[[StackKey, Optional[Services]], Stack],
                 idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        self._start = start
        self.idle_timeout = idle_timeout
        self.key: Optional[StackKey] = None
        self.stack: Optional[Stack] = None
        self.user = ""  # the module that last acquired it (for the leak message)
        self.starts = 0

    def acquire(self, key: StackKey, services: Optional[Services], who: str) -> Stack:
        if self.key == key and self.stack is not None:
            self.stack.check_alive()  # a worker that died since its last check: fail loudly
            self.user = who
            return self.stack
        self.stop(check=True)  # its users' teardowns checked it already; this is the safety net
        self.stack = self._start(key, services)
        self.key, self.user = key, who
        self.starts += 1
        return self.stack

    def release(self, key: StackKey, keep: bool) -> None:
        """A module's last test using `key` is done: fail if anything is left held; stop the stack
        unless the next test uses the same key (`keep`)."""
        if self.key != key or self.stack is None:
            return
        try:
            assert_idle(self.stack, self.user, self.idle_timeout)
        except BaseException:
            self.stop(check=False)  # the next user starts clean
            raise
        if not keep:
            self.stop(check=False)

    def stop(self, check: bool) -> None:
        stack, user = self.stack, self.user
        self.key, self.stack = None, None
        if stack is None:
            return
        try:
            if check:
                assert_idle(stack, user, self.idle_timeout)
        finally:
            stack.stop()


STASH_KEY = pytest.StashKey[Optional[StackKey]]()
NEXT_KEY = pytest.StashKey[Optional[StackKey]]()


def declared_key(item: pytest.Item) -> Optional[StackKey]:
    """The shared stack a test uses: a `StackKey` among its parameters (a parametrized stack
    fixture's), else its module's `SHARED_STACK` (a key, or a function of the test's parameters
    giving one)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, StackKey):
            return value
    declared: Any = getattr(getattr(item, "module", None), "SHARED_STACK", None)
    if callable(declared):
        return declared(params)
    return declared


def order_items(items: list[pytest.Item]) -> None:
    """Run the tests of each shared key one after another, the keys in order of first appearance,
    all of them where the first such test was; each key's tests keep their order, and every other
    test keeps its place relative to the others."""
    keys = [declared_key(item) for item in items]
    rank: dict[StackKey, int] = {}
    for key in keys:
        if key is not None:
            rank.setdefault(key, len(rank))
    if not rank:
        return
    shared = sorted((i for i, key in enumerate(keys) if key is not None),
                    key=lambda i: rank[keys[i]])  # sorted() is stable: same-key order kept
    first = next(i for i, key in enumerate(keys) if key is not None)
    rest = [i for i, key in enumerate(keys) if key is None]
    order = [i for i in rest if i < first] + shared + [i for i in rest if i > first]
    for item, key in zip(items, keys):
        item.stash[STASH_KEY] = key
    items[:] = [items[i] for i in order]


def key_of(item: Optional[pytest.Item]) -> Optional[StackKey]:
    return None if item is None else item.stash.get(STASH_KEY, None)


def lease(request: pytest.FixtureRequest, key: StackKey) -> Iterator[Stack]:
    """For a module-scoped fixture: the shared stack of `key` for its tests, released (checked
    idle; stopped unless the next test uses it too) after them."""
    pool: SharedStacks = request.getfixturevalue("shared_stacks")
    services = request.getfixturevalue("etcd_nats") if key.discovery == "etcd" else None
    stack = pool.acquire(key, services, request.node.nodeid)
    yield stack
    pool.release(key, keep=request.config.stash.get(NEXT_KEY, None) == key)
