"""Unit tests of the CPU engine's pieces: config, KV pool, sampling, detokenization."""

import pytest
import torch

from components.engine.config import EngineConfig
from components.engine.output.detokenizer import IncrementalDetokenizer, StopStringMatcher
from components.engine.kv.pool import ExtentAllocator, KVPool, PageRun
from components.engine.output.sampling import SamplingState, make_generator, sample
from components.engine.output.sampling_params import SamplingParams
from tests.support.engine_helpers import byte_token_ids


# ---- config ------------------------------------------------------------------------------------
def test_config_defaults_and_unknown_kwarg():
    cfg = EngineConfig.from_kwargs(model_path="/m")
    assert cfg.served_model_name == "/m"
    assert cfg.disaggregation_bootstrap_port == 8998
    assert cfg.bootstrap_timeout <= 30 and cfg.transfer_timeout <= 30
    with pytest.raises(TypeError, match="tp_sizee"):
        EngineConfig.from_kwargs(model_path="/m", tp_sizee=2)
    with pytest.raises(TypeError, match="model_path"):
        EngineConfig.from_kwargs()


def test_config_default_pool_size_is_bounded_in_bytes():
    cfg = EngineConfig(model_path="/m", page_size=16)
    assert cfg.num_pages(bytes_per_token=512) * 16 == 65536  # tiny: the token cap
    assert cfg.num_pages(bytes_per_token=16384) * 16 == 16384  # small: 256 MiB
    assert EngineConfig(model_path="/m", max_total_tokens=100).num_pages(16384) == 6


@pytest.mark.parametrize("kw, field", [
    ({"disaggregation_mode": "both"}, "disaggregation_mode"),
    ({"page_size": 0}, "page_size"),
    ({"max_total_tokens": 3}, "max_total_tokens"),
    ({"dtype": "int8"}, "dtype"),
    ({"transfer_timeout": 0}, "transfer_timeout"),
    ({"disaggregation_transfer_backend": "mooncake"}, "disaggregation_transfer_backend"),
])
def test_config_rejects_bad_values(kw, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model_path="/m", **kw)


# ---- KV pool -----------------------------------------------------------------------------------
def test_extent_allocator_first_fit_merge_and_double_free():
    a = ExtentAllocator(10)
    r1, r2, r3 = a.allocate(3), a.allocate(3), a.allocate(4)
    assert (r1.start_page, r2.start_page, r3.start_page) == (0, 3, 6)
    assert a.allocate(1) is None and a.pages_in_use == 10
    a.free(r2)
    assert a.allocate(4) is None  # only 3 contiguous pages are free
    a.free(r1)
    assert a.largest_free() == 6  # r1 and r2 merged
    with pytest.raises(RuntimeError, match="double free"):
        a.free(r1)
    a.free(r3)
    assert a.pages_in_use == 0 and a.largest_free() == 10


def test_pool_views_alias_the_tensor_and_runs_cover_request():
    pool = KVPool(num_layers=2, num_kv_heads=2, head_dim=4, num_pages=8, page_size=4,
                  dtype=torch.float32)
    run = pool.allocate(6)
    assert run == PageRun(0, 2) and pool.pages_in_use == 2
    run2 = pool.allocate(5)
    start = run2.start_page * pool.page_size
    view = pool.k_view(1, start, 5)
    assert view.shape == (1, 2, 5, 4)
    view.fill_(7.0)
    assert pool.tensor[1, 0, :, start:start + 5].eq(7).all()  # a view, not a copy
    runs = pool.token_runs(run2, 5)
    assert len(runs) == 2 * 2 * 2
    # Run 5 is layer 1, K, head 1: its address is that plane's slice.
    assert runs[5][0] == pool.tensor[1, 0, 1, start:].data_ptr()
    assert all(n == 5 * 4 * 4 for _, n in runs)
    with pytest.raises(ValueError):
        pool.token_runs(run2, 9)
    pool.free(run)
    pool.free(run2)
    assert pool.pages_in_use == 0


# ---- sampling params -----------------------------------------------------------------------------
def test_sampling_params_defaults_and_greedy():
    sp = SamplingParams.from_dict(None, 100)
    assert sp.max_new_tokens == 128 and sp.top_k == -1 and not sp.is_greedy
    assert SamplingParams.from_dict({"temperature": 0}, 100).is_greedy
    assert SamplingParams.from_dict({"top_k": 1}, 100).is_greedy
    assert SamplingParams.from_dict({"stop": "x", "max_new_tokens": None}, 100).stop == ("x",)


@pytest.mark.parametrize("params, needle", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"n": 0}, "n must be at least 1"),
    ({"stop_token_ids": [100]}, "stop_token_ids"),
    ({"regex": 5}, "regex"),
    ({"bogus": 1}, "bogus"),
    ({"temperature": "hot"}, "temperature"),
])
def test_sampling_params_rejections_name_the_field(params, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams.from_dict(params, 100)


def _state(params, history=(), seed=0, stop_ids=()):
    sp = SamplingParams.from_dict(params, 10)
    return SamplingState(sp, make_generator(sp, seed), tuple(stop_ids), list(history))


def test_sampler_greedy_penalties_and_min_new_tokens():
    logits = torch.tensor([[0.0, 5.0, 4.9, 1.0]])
    assert sample(logits.clone(), [_state({"temperature": 0})]) == [1]
    # Token 1 was generated twice: frequency penalty moves the argmax to token 2.
    st = _state({"temperature": 0, "frequency_penalty": 0.5}, history=[1, 1])
    assert sample(logits.clone(), [st]) == [2]
    st = _state({"temperature": 0, "repetition_penalty": 1.5}, history=[1])
    assert sample(logits.clone(), [st]) == [2]
    st = _state({"temperature": 0, "min_new_tokens": 2}, history=[3], stop_ids=[1])
    assert sample(logits.clone(), [st]) == [2]  # stop token masked until min_new_tokens


def test_sampler_seeded_reproducible_and_filters():
    logits = torch.randn(1, 10)
    a = [sample(logits.clone(), [_state({"sampling_seed": 7})])[0] for _ in range(1)]
    st1, st2 = _state({"sampling_seed": 7}), _state({"sampling_seed": 7})
    draws1 = [sample(logits.clone(), [st1])[0] for _ in range(20)]
    draws2 = [sample(logits.clone(), [st2])[0] for _ in range(20)]
    assert draws1 == draws2 and draws1[0] == a[0]
    assert len(set(draws1)) > 1  # temperature 1 over 10 tokens is not degenerate
    top = int(torch.argmax(logits))
    st = _state({"top_k": 1, "temperature": 1.0})
    assert sample(logits.clone(), [st]) == [top]
    st = _state({"min_p": 1.0, "sampling_seed": 3})
    assert {sample(logits.clone(), [st])[0] for _ in range(10)} == {top}
    st = _state({"top_p": 1e-6, "sampling_seed": 3})
    assert {sample(logits.clone(), [st])[0] for _ in range(10)} == {top}


# ---- detokenizer ---------------------------------------------------------------------------------
def test_detokenizer_never_emits_half_a_character(tokenizer):
    text = "héllo 世界 🙂!"
    ids = byte_token_ids(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=[5, 6])
    deltas = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas  # some tokens completed no character and were held back


def test_detokenizer_flush_emits_incomplete_tail(tokenizer):
    ids = byte_token_ids(tokenizer, "a世")[:-1]  # "a" plus 2 of the 3 bytes of 世
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=[])
    assert "".join(detok.add(t) for t in ids) == "a"
    assert detok.flush() == "\ufffd"


def test_stop_matcher_holds_back_prefixes_and_trims():
    m = StopStringMatcher(("STOP", "xy"))
    assert m.push("abc ST") == ("abc ", None)  # "ST" could start "STOP"
    assert m.push("O") == ("", None)
    assert m.push("P tail") == ("", "STOP")
    m = StopStringMatcher(("STOP",))
    assert m.push("ST") == ("", None)
    assert m.push("ART") == ("START", None)  # resolved: not a stop string
    assert m.flush() == ""
    m = StopStringMatcher(("end",), no_stop_trim=True)
    assert m.push("the end!") == ("the end", "end")
    assert StopStringMatcher(()).push("x") == ("x", None)
