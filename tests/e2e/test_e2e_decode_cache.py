"""A conversation's next turn moves only its new tokens' KV: decode workers with a prefix cache
(`--disaggregation-decode-enable-radix-cache`) through the real frontend (`--router-mode kv`).

Each turn resends the whole chat, and every answer equals the aggregated worker's for the same
chat. On the CPU engine, in both orchestration styles: from the second turn on, the decode that
served the last turn copies the history it kept (its `/engine/prefix_cache` hit counter grows by
at least the last prompt's whole pages), and the prefill WRITEs only the rest (its
`kv_transfer_bytes` grow by the other tokens only). Decode-orchestrated, the two decode workers
publish their cache's KV events and the frontend's KV router sends every turn of a conversation
to the decode that holds it (Dynamo's own request counter on each decode tells which served it).
Frontend-orchestrated, Dynamo 1.6.1 picks the decode by load, so that stack has one.

On `sglang.Engine` (SGLang's CPU path, its own decode radix cache and NIXL connector), in both
styles: exact answers, every turn on the decode that holds the chat (decode-orchestrated, the
worker relays its KV events), and from the second turn on the prefill sends at most the tokens
after the last prompt (SGLang's own `sglang:kv_transfer_total_mb`; SGLang pages by 1 token on
CPU). A decode restarted mid-chat serves the next turn exactly, the history sent again, on both
engines. Eviction and aborts on the CPU engine: tests/unit/engine/test_engine_decode_cache.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.decode_cache import (
    DECODES, decode_hits, decodes_of, kv_bytes, start_decode, start_decode_cached, wait_registered,
)
from harness.kv_routing import prefill_requests
from harness.topology import wait_until
from harness.worker_metrics import scrape
from tests.e2e.client import chat
from tests.support.topologies import ENGINE_ARGS, SGLANG_ENGINE_ARGS

# Four SGLang engines start together in the decode-orchestrated SGLang stack (50-110 s here).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

SERVED, AGG_SERVED = "tiny-dc", "tiny-dc-agg"
PAGES = {"cpu": 16, "sglang": 1}  # ENGINE_ARGS' page size; SGLang's on CPU
TURNS = 3
RELAYED = "dynamo_component_kv_publisher_zmq_events_total"


@pytest.fixture(scope="module", params=[("cpu", "decode"), ("cpu", "frontend"),
                                        ("sglang", "decode"), ("sglang", "frontend")],
                ids="-".join)
def stack(tmp_path_factory, tiny_model_path, request):
    engine, style = request.param
    args = ENGINE_ARGS if engine == "cpu" else SGLANG_ENGINE_ARGS
    s = start_decode_cached(tmp_path_factory.mktemp(f"decode-cache-{engine}-{style}"),
                            tiny_model_path, SERVED, AGG_SERVED, args, style, engine)
    s.engine, s.style, s.engine_args = engine, style, args
    yield s
    s.stop()


def answer(http, stack, model: str, messages: list[dict]) -> tuple[str, int]:
    out = chat(http, stack.url, {"model": model, "messages": messages, "max_tokens": 12,
                                 "temperature": 0, "ignore_eos": True})
    return out["choices"][0]["message"]["content"], out["usage"]["prompt_tokens"]


def conversations(http, stack):
    """Each turn of two conversations: (conversation, turn, prompt tokens, the decode that
    served it, and what `measure` read around it)."""
    decodes = decodes_of(stack.style)
    for conversation in range(2):
        messages = [{"role": "user", "content": f"Conversation {conversation}: tell me about "
                                                "rivers, lakes and the sea, at some length."}]
        for turn in range(TURNS):
            served, before = prefill_requests(stack, decodes), measure(stack)
            text, prompt = answer(http, stack, SERVED, messages)
            assert text == answer(http, stack, AGG_SERVED, messages)[0], (conversation, turn)
            now = prefill_requests(stack, decodes)
            (decode,) = [d for d in decodes if now[d] > served[d]]
            yield conversation, turn, prompt, decode, before, measure(stack)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"And turn {turn + 1}?"}]


def measure(stack) -> dict:
    """The KV bytes the prefill sent so far; per decode, its cache's hits (CPU engine) or the KV
    events relayed from its scheduler (SGLang)."""
    if stack.engine == "sglang":
        decodes = {d: scrape(stack.procs[d].system_port).get((RELAYED, ""), 0.0)
                   for d in DECODES if d in stack.procs}
    else:
        decodes = decode_hits(stack)
    return {"bytes": kv_bytes(stack, stack.engine), **decodes}


@pytest.fixture(scope="module")
def per_token(tiny_model_path) -> int:
    """KV bytes per token: K and V of every layer and KV head, float32 on both engines here."""
    config = json.loads((Path(tiny_model_path) / "config.json").read_text())
    return (config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config["head_dim"]
            * 4)


def test_each_turn_goes_to_the_decode_that_holds_the_chat_and_equals_aggregated(stack, http,
                                                                               per_token):
    holders: dict[int, str] = {}
    page, last_prompt, start = PAGES[stack.engine], 0, measure(stack)
    for conversation, turn, prompt, decode, before, after in conversations(http, stack):
        assert holders.setdefault(conversation, decode) == decode, (conversation, turn)
        sent = after["bytes"] - before["bytes"]
        last_prompt = last_prompt if turn else 0  # a new conversation
        if stack.engine == "sglang":
            # At most what follows the last prompt (the first turn: what follows the chat
            # template's opening, which earlier requests left in the decode's cache too).
            assert 0 < sent <= per_token * (prompt - last_prompt), (sent, prompt)
        else:  # its hits: from the second turn on, at least the last prompt's whole pages
            gained = after[decode] - before[decode]
            assert gained >= page * (last_prompt // page), (gained, last_prompt)
            assert sent == per_token * (prompt - gained)
        last_prompt = prompt
    if stack.engine == "sglang" and stack.style == "decode":  # the holders' caches' KV events
        wait_until(lambda: all(measure(stack)[d] > start[d] for d in holders.values()), 30,
                   "the decodes' KV events relayed")


def test_after_a_decode_restart_the_next_turn_is_sent_again_and_equals_aggregated(stack, http,
                                                                                  per_token):
    """The restarted decode lost its cache, and the other decode never had this chat: the turn
    moves the history again (CPU engine: its whole prompt), served exactly (no router state
    points at the old process)."""
    messages = [{"role": "user", "content": "A chat about mountains that a restart interrupts."}]
    served = prefill_requests(stack, decodes_of(stack.style))
    text, first = answer(http, stack, SERVED, messages)
    now = prefill_requests(stack, decodes_of(stack.style))
    (holder,) = [d for d in now if now[d] > served[d]]
    stack.procs[holder].stop()
    start_decode(stack, holder, SERVED, stack.engine_args, stack.style, stack.engine)
    wait_registered(stack, (holder,), stack.style)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    before = measure(stack)
    text, prompt = answer(http, stack, SERVED, messages)
    assert text == answer(http, stack, AGG_SERVED, messages)[0]
    after = measure(stack)
    sent = after["bytes"] - before["bytes"]
    if stack.engine == "sglang":  # more than what follows the first turn's prompt
        assert sent > per_token * (prompt - first), (sent, prompt, first)
    else:
        assert sent == per_token * prompt
        assert {d: after[d] for d in decodes_of(stack.style)} == {
            d: 0 if d == holder else before[d] for d in decodes_of(stack.style)}
