"""Fixtures of the peer-compatibility suite: the standard topology (`tests/support/topologies.py`), one
stack per mode shared by every module of this package (and by other modules:
`tests/support/shared_stacks.py`), and the two models it serves.

`stack` is parametrized over the two modes (Tokens: the frontend tokenizes; Text: the workers
do) and `model` over the disaggregated `tiny` and the aggregated `tiny-agg`, so each peer
assertion runs four times against one frontend per mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness.topology import Stack
from tests.support.shared_stacks import TEXT, TOKENS, lease
from tests.support.topologies import AGG, DISAGG

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


# The shared stacks of each mode (tests/support/shared_stacks.py); their keys cap JSON whitespace
# (SGLang's --constrained-json-max-whitespace-cnt 1): the random model would otherwise fill a JSON
# answer with whitespace until max_tokens (the peers' tests assume a real model).
KEYS = {"text": TEXT, "tokens": TOKENS}


@pytest.fixture(scope="package", params=[KEYS[mode] for mode in sorted(MODES)], ids=sorted(MODES))
def stack(request) -> Iterator[PeerStack]:
    mode = next(m for m, key in KEYS.items() if key == request.param)
    for started in lease(request, request.param):
        yield PeerStack(started, mode)


@pytest.fixture(params=[DISAGG, AGG])
def model(request) -> str:
    return request.param


@pytest.fixture(scope="package")
def greedy_ids(tiny_model_path, tokenizer):
    """Greedy token ids of the tiny model for a chat body, from the CPU engine in this process
    (aggregated, the same weights as every worker): the answer's ids, which neither mode's HTTP
    answer shows (re-encoding the text does not give them back)."""
    from components.engine.process.engine import CpuEngine
    from tests.support.topologies import CONTEXT_LENGTH

    engine = CpuEngine(model_path=tiny_model_path, skip_tokenizer_init=True,
                       context_length=CONTEXT_LENGTH, max_total_tokens=8192)

    def run(messages: list[dict], n: int) -> list[int]:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
        params = {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}
        out = asyncio.run(engine.async_generate(input_ids=prompt, sampling_params=params))
        return list(out["output_ids"])

    yield run
    engine.shutdown()
