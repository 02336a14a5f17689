"""The multi-turn benchmark's arithmetic (benchmarks/bench_multi_turn.py): the share of a turn's
KV transfer the decode already had, and the per-turn medians it reports."""

from __future__ import annotations

from argparse import Namespace

from benchmarks.bench_multi_turn import held_share, tables, user_messages


def row(conversation: int, turn: int, prompt: int, held: int, kv: float, ttft: float) -> dict:
    return {"conversation": conversation, "turn": turn, "prompt_tokens": prompt,
            "decode_held_tokens": held, "disagg_kv_bytes": kv, "disagg-cache_kv_bytes": kv / 4,
            "disagg_ttft_ms": ttft, "disagg-cache_ttft_ms": ttft / 4, "agg_ttft_ms": ttft / 2,
            **{f"{arm}_{key}": value for arm in ("disagg", "disagg-cache", "agg",
                                                 "dynamo-disagg-cache")
               for key, value in (("e2e_ms", 500.0), ("output_tokens", 8))}}


def test_the_held_share_is_the_last_turns_prompt_and_answer_over_this_prompt():
    assert held_share(row(0, 0, 100, 0, 1.0, 1.0)) == 0.0
    assert held_share(row(0, 1, 300, 150, 1.0, 1.0)) == 0.5
    assert held_share(row(0, 1, 100, 150, 1.0, 1.0)) == 1.0  # never more than all of it


def test_tables_report_per_turn_medians_and_per_arm_percentiles():
    rows = [row(0, 0, 100, 0, 10.0, 4.0), row(1, 0, 120, 0, 12.0, 8.0),
            row(0, 1, 200, 132, 20.0, 6.0), row(1, 1, 240, 152, 24.0, 10.0)]
    out = tables(rows, turns=2)
    assert out["table"]["rows"] == [[1, 110.0, 6.0, 1.5, 3.0, 11.0, 2.75, 0.0],
                                    [2, 220.0, 8.0, 2.0, 4.0, 22.0, 5.5, (0.66 + 152 / 240) / 2]]
    assert [r[0] for r in out["arms_table"]["rows"]] == ["disagg", "disagg-cache", "agg"]
    assert out["arms_table"]["rows"][0][1] == 7.0  # p50 of 4, 6, 8, 10
    assert out["arms_table"]["rows"][0][3] == 16.0  # 8 tokens per 0.5 s


def test_each_conversation_has_its_own_messages_of_the_asked_length():
    messages = user_messages(Namespace(conversations=2, turns=3, turn_words=5))
    assert [len(c) for c in messages] == [3, 3]
    assert all(len(m.split()) == 5 for c in messages for m in c)
    assert messages[0] != messages[1]
    assert messages == user_messages(Namespace(conversations=2, turns=3, turn_words=5))


def test_the_sglang_run_reports_its_own_arms_and_dynamos():
    rows = [{**row(0, 0, 100, 0, 8.0, 4.0), "dynamo-disagg-cache_ttft_ms": 5.0,
             "dynamo-disagg-cache_kv_bytes": 3.0}]
    out = tables(rows, turns=1, engine="sglang")
    assert out["table"]["headers"][2:] == [
        "TTFT disagg ms", "TTFT disagg-cache ms", "TTFT dynamo-disagg-cache ms",
        "KV bytes disagg", "KV bytes disagg-cache", "KV bytes dynamo-disagg-cache",
        "the last turn's share"]
    assert out["table"]["rows"] == [[1, 100.0, 4.0, 1.0, 5.0, 8.0, 2.0, 3.0, 0.0]]
