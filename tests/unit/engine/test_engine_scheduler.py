"""The scheduler and output processor with a scripted fake model: streaming of multi-byte
characters split across tokens, stop strings spanning tokens, batching and chunked-prefill
bookkeeping, without torch forwards."""

import pytest
import torch
from transformers import AutoTokenizer

from components.engine.core.batch import Batch
from components.engine.config import DisaggregationMode
from components.engine.kv.pool import KVPool
from components.engine.core.processor import OutputProcessor
from components.engine.core.request_checks import Limits
from components.engine.output.sampling_params import SamplingParams
from components.engine.core.scheduler import Scheduler, SchedulerConfig
from components.engine.core.sequence import Sequence
from tests.support.engine_helpers import byte_token_ids

VOCAB = 2048
EOS = 2


class ScriptedRunner:
    """Greedy 'model' that emits a fixed token script per request (keyed by pool position)."""

    def __init__(self, vocab: int) -> None:
        self.vocab_size = vocab
        self.scripts: dict[int, list[int]] = {}
        self.batches: list[Batch] = []

    def _logits(self, token: int) -> torch.Tensor:
        row = torch.zeros(self.vocab_size)
        row[token] = 10.0
        return row

    def forward(self, batch: Batch) -> torch.Tensor:
        self.batches.append(batch)
        rows = []
        for chunk in batch.prefill:
            seq = chunk.seq
            self.scripts[seq.start_tok] = list(seq.input_ids[1:])  # the prompt is the script
            if chunk.completes_prompt:
                rows.append(self._logits(self.scripts[seq.start_tok][0]))
        for seq in batch.decode:
            script, i = self.scripts[seq.start_tok], len(seq.output_ids)
            rows.append(self._logits(script[i] if i < len(script) else EOS))
        return torch.stack(rows) if rows else torch.zeros(0, self.vocab_size)

    @property
    def decode_sizes(self) -> list[int]:
        return [len(b.decode) for b in self.batches if b.decode]


def make_scheduler(tok, chunked_prefill_size=None, max_prefill_tokens=8192):
    pool = KVPool(1, 1, 4, num_pages=64, page_size=16, dtype=torch.float32)
    processor = OutputProcessor(tok, frozenset({EOS}), VOCAB, 1, 0, defer_first_token=False)
    cfg = SchedulerConfig(8, max_prefill_tokens, chunked_prefill_size)
    limits = Limits(VOCAB, 1024, pool.num_tokens, DisaggregationMode.NULL)
    return Scheduler(cfg, limits, pool, processor, tok, disagg=None)


@pytest.fixture()
def setup(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    return make_scheduler(tok), ScriptedRunner(VOCAB), tok


def submit(sched, script, **params):
    chunks = []
    seq = Sequence(rid=f"r{len(sched.live)}-{script[0]}", sink=lambda c, final: chunks.append(c),
                   params=SamplingParams.from_dict({"temperature": 0, **params}, VOCAB),
                   input_ids=[7] + script)
    sched.add(seq)
    return chunks


def step(sched, runner):
    """One engine step, as the engine thread runs it."""
    batch = sched.schedule()
    if batch:
        sched.update(sched.processor.postprocess(batch, runner.forward(batch)))
    return batch


def run(sched, runner, limit=400):
    for _ in range(limit):
        if not sched.live:
            return
        step(sched, runner)
    raise AssertionError("scheduler did not finish")


def test_split_multibyte_characters_stream_without_replacement_chars(setup):
    sched, runner, tok = setup
    text = "naïve café 日本 🙂"
    chunks = submit(sched, byte_token_ids(tok, text), max_new_tokens=200)
    run(sched, runner)
    deltas = [c["text"] for c in chunks]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}


def test_stop_string_across_byte_tokens(setup):
    sched, runner, tok = setup
    chunks = submit(sched, byte_token_ids(tok, "abc 日本 xyz"), max_new_tokens=200, stop=["日本"])
    run(sched, runner)
    assert "".join(c["text"] for c in chunks) == "abc "
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": "日本"}


def test_rows_join_and_leave_one_batch(setup):
    sched, runner, tok = setup
    a = submit(sched, byte_token_ids(tok, "short"), max_new_tokens=50)
    b = submit(sched, byte_token_ids(tok, "a longer line"), max_new_tokens=50)
    step(sched, runner)
    step(sched, runner)
    c = submit(sched, byte_token_ids(tok, "late"), max_new_tokens=50)
    run(sched, runner)
    assert ["".join(x["text"] for x in chunks) for chunks in (a, b, c)] == [
        "short", "a longer line", "late"]
    assert max(runner.decode_sizes) == 3 and runner.decode_sizes[-1] == 1
    assert sched.pool.pages_in_use == 0


def test_waiting_prompts_share_one_prefill_forward(setup):
    sched, runner, tok = setup
    for text in ("one", "two", "three"):
        submit(sched, byte_token_ids(tok, text), max_new_tokens=5)
    batch = step(sched, runner)
    assert [c.seq.rid for c in batch.prefill] == list(sched.live)
    assert not batch.decode and len(batch.sampled) == 3


def test_a_prefill_step_is_followed_by_a_decode_step(setup):
    """Admissions never starve running rows: after a prefill forward the running batch gets
    its decode forward before the next prompt is prefilled. The prefill step itself runs no
    decode rows, so a new request's first token goes out without waiting for one."""
    sched, runner, tok = setup
    first = submit(sched, [30, 31, 32, 33], max_new_tokens=4)
    kinds = []
    for i in range(4):
        if i == 1:
            submit(sched, [40, 41, 42], max_new_tokens=3)
        batch = step(sched, runner)
        kinds.append(("P" if batch.prefill else "") + ("D" if batch.decode else ""))
        if i == 0:
            assert [c["output_ids"] for c in first] == [[30]]
    assert kinds == ["P", "D", "P", "D"]


def test_prefill_token_budget_splits_admissions_across_steps(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    sched, runner = make_scheduler(tok, max_prefill_tokens=20), ScriptedRunner(VOCAB)
    for n in (12, 12, 12):
        submit(sched, list(range(100, 100 + n)), max_new_tokens=2)
    run(sched, runner)
    prefills = [[c.end - c.begin for c in b.prefill] for b in runner.batches if b.prefill]
    assert prefills == [[13], [13], [13]]  # 13 + 13 > 20: one prompt per step


@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_chunked_prefill_streams_the_same_tokens(tiny_model_path, chunk):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = "a prompt long enough to be split into several prefill chunks"
    outs = []
    for size in (None, chunk):
        sched, runner = make_scheduler(tok, chunked_prefill_size=size), ScriptedRunner(VOCAB)
        running = submit(sched, byte_token_ids(tok, "decoding meanwhile"), max_new_tokens=80)
        step(sched, runner)
        chunks = submit(sched, byte_token_ids(tok, text), max_new_tokens=100)
        run(sched, runner)
        outs.append(("".join(c["text"] for c in chunks), "".join(c["text"] for c in running)))
        pieces = [c.end - c.begin for b in runner.batches for c in b.prefill
                  if c.seq.prompt_len > 40]
        assert max(pieces) <= (size or 10**9) and sum(pieces) == len(text) + 1
        assert sched.pool.pages_in_use == 0
    assert outs[0] == outs[1] == (text, "decoding meanwhile")


def test_mixed_chunks_share_the_decode_forward(tiny_model_path):
    """SGLang's enable_mixed_chunk: every step carries the running rows, so a long prompt
    delays them by one chunk, never by its whole prefill; the tokens stay the same."""
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    sched = make_scheduler(tok, chunked_prefill_size=8)
    sched.cfg = SchedulerConfig(8, 8192, 8, enable_mixed_chunk=True)
    runner = ScriptedRunner(VOCAB)
    running = submit(sched, byte_token_ids(tok, "already decoding"), max_new_tokens=60)
    while not running:  # its own prompt goes in chunks too
        step(sched, runner)
    text = "a long prompt forwarded in chunks of eight tokens"
    late = submit(sched, byte_token_ids(tok, text), max_new_tokens=60)
    first = len(runner.batches)
    run(sched, runner)
    shapes = [(len(b.prefill), len(b.decode)) for b in runner.batches[first:]]
    assert shapes[:7] == [(1, 1)] * 7  # 50 prompt tokens: 7 chunks, each with the decode row
    assert "".join(c["text"] for c in late) == text
    assert "".join(c["text"] for c in running) == "already decoding"
