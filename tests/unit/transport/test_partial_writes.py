"""A decode that already holds a prompt's first tokens (its prefix cache) registers only the
rest, and the prefill WRITEs only that: real ZMQ and NIXL in one process."""

from __future__ import annotations

import pytest
import torch

from components.engine.disagg.transport.runs import skip_tokens
from harness.transport_side import (
    HEAD_DIM, HELD, KV_HEADS, LAYERS, PAGE_SIZE, expected_kv, poll_until,
)

HOST = "127.0.0.1"
BYTES_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4  # float32 K and V


@pytest.mark.parametrize("skip", [0, PAGE_SIZE, 3 * PAGE_SIZE])
def test_only_the_tokens_the_decode_lacks_are_written(pair, skip):
    pre, dec = pair
    room, tokens = 31 + skip, 3 * PAGE_SIZE + 5
    dec.add_decode(room, HOST, pre.transport.bootstrap_port, tokens, skip)
    pre.add_prefill(room, tokens, first_token=5)
    arrived = poll_until([pre, dec], lambda e: e.get("room") == room and e["event"] != "done", 10)
    assert arrived["event"] == "arrived"
    run, _ = dec.held[room]
    start = run.start_page * PAGE_SIZE
    got = dec.pool.tensor[:, :, :, start:start + tokens]
    assert torch.equal(got[:, :, :, skip:], expected_kv(room, tokens)[:, :, :, skip:])
    assert bool((got[:, :, :, :skip] == HELD).all())  # the decode's own tokens: untouched
    assert poll_until([pre, dec], lambda e: e == {"event": "done", "room": room}, 10)
    totals = pre.transport.transfer_totals
    assert (totals.writes, totals.nbytes) == (1, (tokens - skip) * BYTES_PER_TOKEN)
    dec.free(room)


def test_a_skip_that_does_not_match_the_runs_fails_the_room(pair):
    pre, dec = pair
    room, tokens = 41, 2 * PAGE_SIZE
    run = dec.pool.allocate(tokens)
    dec.held[room] = (run, tokens)
    # Claims to hold 4 tokens but registers runs 8 tokens short.
    runs = dec.pool.token_runs(run, tokens, 8)
    dec.transport.add_decode(room, HOST, pre.transport.bootstrap_port, runs, "rid-41", 4)
    pre.add_prefill(room, tokens, first_token=5)
    for side in (pre, dec):  # both ends of the room fail, naming the mismatch
        failed = poll_until([pre, dec], lambda e: e.get("room") == room and e in side.events, 10)
        assert failed["event"] == "failed" and "KV layout mismatch" in failed["message"]


def test_skip_tokens_trims_each_plane():
    src = [(1000, 40), (2000, 40)]  # two planes of 10 tokens x 4 bytes
    assert skip_tokens(src, 10, [(0, 28), (500, 28)], 3) == [(1012, 28), (2012, 28)]
    assert skip_tokens(src, 10, [(0, 80)], 0) == src
    for tokens, dst, skip in ((10, [(0, 28)], 3), (10, [(0, 28), (0, 24)], 3),
                              (10, [(0, 32), (0, 32)], 3), (0, [(0, 28), (0, 28)], 3),
                              (10, [(0, 4), (0, 4)], 10), (7, [(0, 28), (0, 28)], 3)):
        with pytest.raises(ValueError, match="KV layout mismatch"):
            skip_tokens(src, tokens, dst, skip)
