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

On `sglang.Engine` (SGLang's CPU path, its own decode radix cache and NIXL connector), the
decode-orchestrated stack: exact answers, and every turn on the decode that holds the chat, whose
KV events the worker relays. SGLang's decode counters are not exposed here, so the bytes are the
CPU engine's claim only."""

from __future__ import annotations

import pytest

from harness.decode_cache import (
    DECODES, PREFILL, decode_hits, decodes_of, start_decode, start_decode_cached, wait_registered,
)
from harness.kv_routing import prefill_requests
from harness.worker_metrics import PREFIX, scrape
from tests.e2e.client import chat
from tests.support.topologies import ENGINE_ARGS, SGLANG_ENGINE_ARGS

# Four SGLang engines start together in the SGLang stack (about 110 s on this 2-core box).
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

SERVED, AGG_SERVED = "tiny-dc", "tiny-dc-agg"
PAGE = 16  # ENGINE_ARGS' page size
TURNS = 3
KV_BYTES = f"{PREFIX}kv_transfer_bytes_total"
RELAYED = "dynamo_component_kv_publisher_zmq_events_total"


@pytest.fixture(scope="module", params=[("cpu", "decode"), ("cpu", "frontend"),
                                        ("sglang", "decode")], ids="-".join)
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


def kv_bytes(stack) -> float:
    return scrape(stack.procs[PREFILL].system_port).get((KV_BYTES, ""), 0.0)


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
    if stack.engine == "sglang":
        return {d: scrape(stack.procs[d].system_port).get((RELAYED, ""), 0.0) for d in DECODES}
    return {"bytes": kv_bytes(stack), **decode_hits(stack)}


def test_each_turn_goes_to_the_decode_that_holds_the_chat_and_equals_aggregated(stack, http):
    holders: dict[int, str] = {}
    last_prompt = 0
    for conversation, turn, prompt, decode, before, after in conversations(http, stack):
        assert holders.setdefault(conversation, decode) == decode, (conversation, turn)
        if stack.engine == "sglang":  # the decode's cache reported the turn's blocks
            assert after[decode] > before[decode], (before, after)
            continue
        hit = after[decode] - before[decode]
        if turn == 0:
            per_token = (after["bytes"] - before["bytes"]) / prompt  # the whole prompt moved
            assert per_token > 0 and hit == 0
        else:  # the history it kept, at least the last prompt's whole pages, did not move
            assert hit >= PAGE * (last_prompt // PAGE), (hit, last_prompt)
            assert after["bytes"] - before["bytes"] == per_token * (prompt - hit)
        last_prompt = prompt


def test_after_a_decode_restart_the_next_turn_is_sent_whole_and_equals_aggregated(stack, http):
    """The restarted decode lost its cache, and the other decode never had this chat: the turn
    moves its whole prompt, served exactly (no router state points at the old process)."""
    if stack.engine == "sglang":
        pytest.skip("what moved is read from the CPU engine's counters")
    messages = [{"role": "user", "content": "A chat about mountains that a restart interrupts."}]
    served, sent = prefill_requests(stack, decodes_of(stack.style)), kv_bytes(stack)
    text, prompt = answer(http, stack, SERVED, messages)
    per_token = (kv_bytes(stack) - sent) / prompt
    now = prefill_requests(stack, decodes_of(stack.style))
    (holder,) = [d for d in now if now[d] > served[d]]
    stack.procs[holder].stop()
    start_decode(stack, holder, SERVED, stack.engine_args, stack.style, stack.engine)
    wait_registered(stack, (holder,), stack.style)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    hits, sent = decode_hits(stack), kv_bytes(stack)
    text, prompt = answer(http, stack, SERVED, messages)
    assert text == answer(http, stack, AGG_SERVED, messages)[0]
    assert decode_hits(stack) == {d: 0 if d == holder else n for d, n in hits.items()}
    assert kv_bytes(stack) - sent == per_token * prompt
