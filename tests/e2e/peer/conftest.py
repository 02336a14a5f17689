"""Fixtures of the peer-compatibility suite: the standard topology (`tests/topologies.py`), one
stack per mode shared by every module of this package, and the two models it serves.

`stack` is parametrized over the two modes (Tokens: the frontend tokenizes; Text: the workers
do) and `model` over the disaggregated `tiny` and the aggregated `tiny-agg`, so each peer
assertion runs four times against one frontend per mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.topology import Stack
from tests.topologies import AGG, DISAGG, start_topology

MODES = {"tokens": True, "text": False}  # mode -> --skip-tokenizer-init


@dataclass(frozen=True)
class PeerStack:
    stack: Stack
    mode: str

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def tokens(self) -> bool:
        return self.mode == "tokens"


@pytest.fixture(scope="package", params=sorted(MODES))
def stack(request, tmp_path_factory, tiny_model_path) -> Iterator[PeerStack]:
    mode = request.param
    started = start_topology(tmp_path_factory.mktemp(f"peer-{mode}"), tiny_model_path,
                             skip_tokenizer_init=MODES[mode])
    yield PeerStack(started, mode)
    started.stop()


@pytest.fixture(params=[DISAGG, AGG])
def model(request) -> str:
    return request.param
