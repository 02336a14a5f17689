"""SGLang's DP layout and block size as Dynamo 1.6.1 counts them (`dynamo/sglang/capacity.py`),
read from the real `ServerArgs` parse: attention-DP ranks are registered and relayed, on
SGLang 0.5.23 too, which resolves `--dp-size N --enable-dp-attention` into `attn_dp_size=N,
dp_size=1`; `--dcp-size` widens the registered block size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from components.backends.sglang import SglangBackend, dp_layout, local_dp_ranks
from components.worker.flags.config import build_parser

pytestmark = pytest.mark.timeout(60)


def sglang_args(model: str, *extra: str):
    from components.backends.sglang_engine import server_args_from_namespace

    ns = build_parser(SglangBackend()).parse_args(["--model-path", model, *extra])
    return server_args_from_namespace(ns)


def fake_engine(server_args):
    manager = SimpleNamespace(context_len=2048, num_reserved_tokens=0)
    info = {"max_total_num_tokens": 4096, "max_running_requests": 8}
    return SimpleNamespace(server_args=server_args, tokenizer_manager=manager,
                           _scheduler_init_result=SimpleNamespace(scheduler_infos=[info]))


def resolve_deprecated_dp_attention(server_args) -> None:
    """What SGLang 0.5.23's `handle_deprecated_dp_attention` (arg_groups/parallel_hook.py)
    declares at engine start for `--dp-size N --enable-dp-attention` (importing that module
    needs torchvision, which the tests' environment lacks)."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, "_handle_deprecated_dp_attention",
                       attn_dp_size=server_args.dp_size, dp_size=1)
    declare_resolution(server_args, "_handle_deprecated_dp_attention",
                       enable_dp_attention=False)


def test_deprecated_dp_attention_as_sglang_resolves_it_registers_every_rank(tiny_model_path):
    from components.backends.sglang_engine import resolved_server_args, sglang_limits

    server_args = sglang_args(tiny_model_path, "--dp-size", "2", "--enable-dp-attention",
                              "--tp", "2")
    resolve_deprecated_dp_attention(server_args)
    engine = fake_engine(server_args)
    resolved = resolved_server_args(engine)
    assert (resolved.dp_size, resolved.attn_dp_size) == (1, 2)  # what SGLang runs with
    assert sglang_limits(engine).dp_size == 2
    assert SglangBackend().kv_event_dp_ranks(engine) == range(2)


@pytest.mark.parametrize("extra, ranks, local", [
    (("--attn-dp-size", "2", "--tp", "2"), 2, range(2)),
    (("--dp-size", "2", "--enable-dp-attention", "--tp", "2"), 2, range(2)),  # not resolved
    (("--dp-size", "2"), 2, range(2)),  # pure DP
    (("--attn-dp-size", "4", "--tp", "4", "--nnodes", "2", "--node-rank", "1",
      "--dist-init-addr", "10.0.0.1:5000"), 4, range(2, 4)),  # this node's slice
])
def test_the_dp_layout_follows_dynamo(tiny_model_path, extra, ranks, local):
    server_args = sglang_args(tiny_model_path, *extra)
    assert dp_layout(server_args)[0] == ranks
    assert local_dp_ranks(server_args) == local


def test_an_sglang_without_attn_dp_size_reads_the_two_flags():
    """SGLang 0.5.21 has no `attn_dp_size`; a descriptor in its place counts as 1."""
    assert dp_layout(SimpleNamespace(dp_size=4, enable_dp_attention=True)) == (4, True)
    assert dp_layout(SimpleNamespace(dp_size=4, attn_dp_size=property())) == (4, False)


def test_dcp_widens_the_registered_block_size_not_the_pool(tiny_model_path):
    from components.backends.sglang_engine import sglang_limits
    from components.worker.lifecycle.register import runtime_config_for

    server_args = sglang_args(tiny_model_path, "--dcp-size", "2", "--tp", "2",
                              "--page-size", "16")
    limits = sglang_limits(fake_engine(server_args))
    assert (limits.page_size, limits.kv_block_size) == (16, 32)
    # SGLang reports the pool per DCP rank: pages of the physical size, as 1.6.1 counts them.
    assert runtime_config_for(limits).total_kv_blocks == 4096 // 16
