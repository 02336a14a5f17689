"""The scheduler with a scripted fake model: streaming of multi-byte characters split across
tokens, stop strings spanning tokens, and batching bookkeeping, without torch forwards."""

import pytest
import torch
from transformers import AutoTokenizer

from components.engine.kv_pool import KVPool
from components.engine.request_checks import Limits
from components.engine.sampling_params import SamplingParams
from components.engine.scheduler import Scheduler, SchedulerConfig
from components.engine.sequence import Sequence
from tests.engine_helpers import byte_token_ids

VOCAB = 2048
EOS = 2


class ScriptedRunner:
    """Greedy 'model' that emits a fixed token script per request (keyed by pool position)."""

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab
        self.scripts: dict[int, tuple[int, list[int]]] = {}
        self.batch_sizes: list[int] = []

    def _logits(self, token: int) -> torch.Tensor:
        row = torch.zeros(self.vocab_size)
        row[token] = 10.0
        return row

    def prefill(self, input_ids, start_tok):
        script = list(input_ids[1:])  # the "prompt" after its first id is the script to emit
        self.scripts[start_tok] = (len(input_ids), script)
        return self._logits(script[0])

    def decode(self, tokens, starts, lens):
        self.batch_sizes.append(len(tokens))
        rows = []
        for start, n in zip(starts, lens):
            prompt_len, script = self.scripts[start]
            i = n - prompt_len + 1
            rows.append(self._logits(script[i] if i < len(script) else EOS))
        return torch.stack(rows)


@pytest.fixture()
def setup(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    pool = KVPool(1, 1, 4, num_pages=64, page_size=16, dtype=torch.float32)
    runner = ScriptedRunner(VOCAB)
    sched = Scheduler(SchedulerConfig(8, 8192, 1, 0), Limits(VOCAB, 1024, pool.num_tokens, "null"),
                      runner, pool, tok, frozenset({EOS}))
    return sched, runner, tok


def submit(sched, script, **params):
    chunks = []
    seq = Sequence(rid=f"r{len(sched.live)}-{script[0]}", sink=lambda c, final: chunks.append(c),
                   params=SamplingParams.from_dict({"temperature": 0, **params}, VOCAB),
                   input_ids=[7] + script)
    sched.add(seq)
    return chunks


def run(sched, limit=200):
    for _ in range(limit):
        if not sched.live:
            return
        sched.step()
    raise AssertionError("scheduler did not finish")


def test_split_multibyte_characters_stream_without_replacement_chars(setup):
    sched, _, tok = setup
    text = "naïve café 日本 🙂"
    chunks = submit(sched, byte_token_ids(tok, text), max_new_tokens=200)
    run(sched)
    deltas = [c["text"] for c in chunks]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}


def test_stop_string_across_byte_tokens(setup):
    sched, _, tok = setup
    chunks = submit(sched, byte_token_ids(tok, "abc 日本 xyz"), max_new_tokens=200, stop=["日本"])
    run(sched)
    assert "".join(c["text"] for c in chunks) == "abc "
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": "日本"}


def test_rows_join_and_leave_one_batch(setup):
    sched, runner, tok = setup
    a = submit(sched, byte_token_ids(tok, "short"), max_new_tokens=50)
    b = submit(sched, byte_token_ids(tok, "a longer line"), max_new_tokens=50)
    sched.step()
    sched.step()
    c = submit(sched, byte_token_ids(tok, "late"), max_new_tokens=50)
    run(sched)
    assert ["".join(x["text"] for x in chunks) for chunks in (a, b, c)] == [
        "short", "a longer line", "late"]
    assert max(runner.batch_sizes) == 3 and runner.batch_sizes[-1] == 1
    assert sched.pool.pages_in_use == 0


def test_first_token_is_flushed_before_the_batch_decodes(setup):
    """A new request's first token leaves in the step that prefilled it, not after the
    running batch's next decode forward (that would add a decode step to its TTFT)."""
    sched, runner, _ = setup
    events = []
    sched.flush = lambda: events.append(("flush", len(runner.batch_sizes)))
    submit(sched, [30, 31, 32], max_new_tokens=3)
    sched.step()  # prefill, flush, then the batch's first decode
    assert events[0] == ("flush", 0)
    assert runner.batch_sizes == [1]
