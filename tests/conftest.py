"""Fixtures shared by more than one test directory."""

import os
from collections.abc import Callable, Iterator
from typing import Optional

import pytest

from harness.services import Services
from harness.topology import Stack
from tests.support.models import model_path
from tests.support.parallel_groups import make_scheduler, write_groups
from tests.support.shared_stacks import NEXT_KEY, SharedStacks, StackKey, key_of, order_items
from tests.support.topologies import start_topology


def pytest_report_header() -> str:
    """The stack under test: `make test` runs the suite on .venv and its SGLang core once more
    on .venv-sglang-0.5.21 (Makefile), and each run says which it is."""
    import importlib.metadata

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "none"

    return "stack: " + ", ".join(f"{d} {version(d)}" for d in ("sglang", "nixl", "transformers",
                                                               "tokenizers", "torch", "ai-dynamo"))


# Every SGLang worker the tests start (they inherit this environment) runs NIXL's progress thread
# with this delay instead of spinning, and forks SGLang's scheduler and detokenizer from the
# engine's process, which imported SGLang already: tests/support/sglang_cpu/sitecustomize.py.
os.environ.setdefault("TEST_NIXL_PROGRESS_DELAY_US", "1000")
os.environ.setdefault("TEST_SGLANG_FORK", "1")
# Every worker the harness starts is forked from a zygote that imported the worker's modules once
# (harness/zygote.py); TEST_WORKER_ZYGOTE=0 starts each as a plain process.
os.environ.setdefault("TEST_WORKER_ZYGOTE", "1")


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    return str(model_path("tiny"))


@pytest.fixture(scope="session")
def small_model_path() -> str:
    return str(model_path("small"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests of each shared stack (tests/support/shared_stacks.py) one after another, and,
    # under pytest-xdist, which must share a worker (tests/support/parallel_groups.py).
    order_items(items)
    write_groups(config, items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (make test runs two workers)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") == "loadscope":
        return make_scheduler(config, log)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]):
    # Before the fixtures' teardown: whether the next test uses the same shared stack (keep it).
    item.config.stash[NEXT_KEY] = key_of(nextitem)
    return (yield)


@pytest.fixture(scope="session")
def shared_stacks(tmp_path_factory, tiny_model_path) -> Iterator[SharedStacks]:
    """The standard topologies that modules share by key, one alive at a time
    (tests/support/shared_stacks.py); through its `lease`, never directly."""
    def start(key: StackKey, discovery: Optional[Services]) -> Stack:
        return start_topology(tmp_path_factory.mktemp(key.name), tiny_model_path,
                              key.skip_tokenizer_init, key.with_agg, key.prefill_args,
                              key.worker_args, key.orchestrator, discovery)

    pool = SharedStacks(start)
    yield pool
    pool.stop(check=False)  # each user's teardown checked it


@pytest.fixture(scope="module")
def start_stack(tmp_path_factory, tiny_model_path) -> Iterator[Callable[..., Stack]]:
    """Starts the standard topology (`tests/support/topologies.py`) for this module's tests, in a fresh
    directory named after `name`; every one it started is stopped after them. For modules that
    kill, restart or break a process, or need fresh counters: the others share stacks
    (`shared_stacks`)."""
    stacks: list[Stack] = []

    def start(name: str, skip_tokenizer_init: bool, with_agg: bool = True,
              prefill_args: tuple[str, ...] = (), worker_args: tuple[str, ...] = (),
              orchestrator: str = "decode", discovery: Optional[Services] = None) -> Stack:
        stack = start_topology(tmp_path_factory.mktemp(name), tiny_model_path,
                               skip_tokenizer_init, with_agg, prefill_args, worker_args,
                               orchestrator, discovery)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.stop()


@pytest.fixture(scope="session")
def etcd_nats(tmp_path_factory) -> Iterator[Services]:
    """etcd and NATS on loopback, started on first use and shared by the session's stacks."""
    services = Services(tmp_path_factory.mktemp("etcd-nats")).start()
    yield services
    services.stop()


@pytest.fixture
def tok(tiny_model_path):
    """A fresh tiny tokenizer per test (some tests change its template or vocabulary)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def pre(tok):
    """The Text-mode preprocessor on `tok`, shut down after the test."""
    from handlers import Preprocessor

    p = Preprocessor(tok)
    yield p
    p.shutdown()
