"""benchmarks/aiperf_report.py on a recorded aiperf 0.13 export (trimmed to the metrics read, from
a smoke run of benchmarks/bench_aiperf.py against dynamo.sglang), the ratios to dynamo.sglang and
the goals they decide; plus the CPU window cut of benchmarks/proc_tree_cpu.py."""

import json
import os
from pathlib import Path

import pytest

from benchmarks.aiperf_goals import aiperf_parity
from benchmarks.aiperf_peer_goals import peer_goals
from benchmarks.aiperf_report import (
    DISAGG_REFERENCE, REFERENCE, add_worker_cpu, arm_median, headline, integrity_problems,
    load_export, parse_export, ratios_to_reference, table, workload,
)
from benchmarks.proc_tree_cpu import cpu_between, descendants, process_cpu_s

SAMPLE = Path(__file__).with_name("aiperf_export_sample.json")


def sample() -> dict:
    return json.loads(SAMPLE.read_text())


def test_parse_export_picks_aiperfs_metrics_and_phase_bounds():
    m = parse_export(sample())
    assert m["output_tok_per_s"] == pytest.approx(298.1506357)
    assert (m["ttft_p50_ms"], m["ttft_p90_ms"], m["ttft_p99_ms"]) == (70.672, 77.658, 78.338)
    assert (m["itl_p50_ms"], m["itl_p90_ms"], m["itl_p99_ms"]) == (17.177, 28.535, 28.562)
    assert (m["completed"], m["output_tokens"], m["errors"]) == (16, 512, 0)
    assert m["complete"] is True
    assert m["end_s"] - m["start_s"] == pytest.approx(1.717253, abs=1e-5)


def test_missing_metric_is_nan_and_a_cancelled_run_is_not_complete(tmp_path):
    data = sample()
    del data["inter_token_latency"]
    data["was_cancelled"] = True
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(data))
    m = load_export(tmp_path)
    assert m["itl_p50_ms"] != m["itl_p50_ms"]
    assert m["complete"] is False


def _arm(tok_s: float, ttft: float, cpu_s: float, processes: dict | None = None) -> dict:
    m = parse_export(sample())
    m.update(output_tok_per_s=tok_s, ttft_p50_ms=ttft)
    return add_worker_cpu(m, cpu_s, processes or {"worker": cpu_s / 4})


def test_worker_cpu_per_token_and_ratios_to_dynamo_sglang():
    medians = {REFERENCE: _arm(300.0, 70.0, 1.024), "agg-sglang": _arm(330.0, 63.0, 0.512)}
    assert medians[REFERENCE]["worker_cpu_us_per_token"] == pytest.approx(2000.0)
    r = ratios_to_reference(medians)
    assert set(r) == {"agg-sglang"}
    assert r["agg-sglang"]["output_tok_per_s"] == pytest.approx(1.1)
    assert r["agg-sglang"]["ttft_p50"] == pytest.approx(0.9)
    assert r["agg-sglang"]["worker_cpu_per_token"] == pytest.approx(0.5)
    _, rows = table(medians, r)
    assert rows[0][0] == REFERENCE and rows[0][-3:] == [1.0, 1.0, 1.0]
    assert rows[1][-3:] == pytest.approx([1.1, 0.9, 0.5])
    assert ratios_to_reference({"agg": medians["agg-sglang"]}) == {}


@pytest.mark.parametrize("ratios,met", [
    ({"output_tok_per_s": 1.1, "ttft_p50": 0.9, "worker_cpu_per_token": 0.5}, [True] * 3),
    ({"output_tok_per_s": 0.9, "ttft_p50": 1.2, "worker_cpu_per_token": 0.85}, [False] * 3),
])
def test_goals_are_met_by_the_measured_ratios(ratios, met):
    disagg = dict(ratios, reference="dynamo-sglang-disagg")
    goals = aiperf_parity(lambda name: {"ratios": {"agg-sglang": ratios,
                                                   "disagg-sglang": disagg}})
    # Each pair: its 3 goals, then one per worker process (agg: 1, disagg: 2), not measured.
    assert [g.met for g in goals] == met + [None] + met + [None] * 2
    assert [g.met for g in aiperf_parity(lambda name: None)] == [None] * 9
    # A disaggregated arm measured only against the aggregated worker decides nothing.
    agg_only = aiperf_parity(lambda name: {"ratios": {"agg-sglang": ratios,
                                                      "disagg-sglang": ratios}})
    assert [g.met for g in agg_only] == met + [None] * 6


def test_each_worker_process_and_the_spread_over_runs_are_compared():
    ref_runs = [_arm(200.0, 100.0, 2.048, {"prefill": 0.1024, "decode": 0.4096})] * 2
    runs = [_arm(100.0, 120.0, 2.048, {"prefill": 0.1024, "decode": 0.2048}),
            _arm(300.0, 90.0, 2.048, {"prefill": 0.1024, "decode": 0.2048})]
    all_runs = {DISAGG_REFERENCE: ref_runs, "disagg-sglang": runs}
    medians = {arm: arm_median(rs) for arm, rs in all_runs.items()}
    r = ratios_to_reference(medians, all_runs)["disagg-sglang"]
    assert r["process_cpu_per_token"] == pytest.approx({"prefill": 1.0, "decode": 0.5})
    assert r["run_spread"]["output_tok_per_s"] == pytest.approx([0.5, 1.5])
    assert r["run_spread"]["ttft_p50"] == pytest.approx([0.9, 1.2])
    assert r["run_spread"]["process:decode"] == pytest.approx([0.5, 0.5])
    # 1 - (0.1024 + 0.2048) / 2.048: the rest of the trees is SGLang's engine processes.
    assert medians["disagg-sglang"]["engine_share"] == pytest.approx(0.85)
    goals = {g.what: g for g in aiperf_parity(lambda name: {"ratios": {"disagg-sglang": r},
                                                            "median": medians})}
    decode = goals["aiperf: disagg-sglang decode worker process's CPU per output token / "
                   "dynamo.sglang disagg's"]
    assert (decode.measured, decode.met) == ("0.50x", True)
    prefill = goals["aiperf: disagg-sglang prefill worker process's CPU per output token / "
                    "dynamo.sglang disagg's"]
    assert prefill.met is False and "went from 1.00x to 1.00x" in prefill.bound
    tok_s = goals["aiperf: disagg-sglang output tok/s / dynamo.sglang disagg's"]
    assert tok_s.met is True  # the median run: 1.0x
    cpu = goals["aiperf: disagg-sglang worker CPU per output token / dynamo.sglang disagg's"]
    assert cpu.met is False and "85% of this arm's CPU" in cpu.bound
    assert "would still spend 0.85x" in cpu.bound  # the same tree CPU as the reference's
    assert "decode 0.50x, prefill 1.00x" in cpu.bound


def test_disaggregated_arms_are_compared_with_the_disaggregated_reference():
    medians = {REFERENCE: _arm(300.0, 70.0, 1.024), DISAGG_REFERENCE: _arm(200.0, 100.0, 1.0),
               "disagg-sglang": _arm(100.0, 50.0, 1.0), "agg": _arm(600.0, 35.0, 1.024)}
    r = ratios_to_reference(medians)
    assert set(r) == {"disagg-sglang", "agg"}
    assert r["disagg-sglang"]["reference"] == DISAGG_REFERENCE
    assert r["disagg-sglang"]["output_tok_per_s"] == pytest.approx(0.5)
    assert r["agg"]["reference"] == REFERENCE
    assert r["agg"]["ttft_p50"] == pytest.approx(0.5)
    del medians[DISAGG_REFERENCE]  # not measured: the aggregated worker is the reference
    assert ratios_to_reference(medians)["disagg-sglang"]["reference"] == REFERENCE


def test_docs_lines_carry_the_ratios_the_commands_and_the_load():
    data = {"ratios": {"agg-sglang": {"output_tok_per_s": 1.1, "ttft_p50": 0.9,
                                      "worker_cpu_per_token": 0.5}},
            "integrity_problems": [], "command": "python -m benchmarks.bench_aiperf --quick",
            "aiperf_command": "aiperf profile --concurrency 8",
            "config": {"model_path": "/m/tiny-seed0", "input_tokens": 256, "output_tokens": 32,
                       "concurrency": 8, "requests": 16},
            "machine": {"loadavg_1m_at_start": 2.5},
            "runs": {"agg": [{"loadavg_1m": 3.0}, {"loadavg_1m": 9.25}]}}
    lines = headline(data)
    assert lines[0].startswith("agg-sglang / dynamo-sglang: output tok/s **1.10x**")
    assert "`python -m benchmarks.bench_aiperf --quick`" in lines[-1]
    assert "`aiperf profile --concurrency 8`" in lines[-1]
    assert workload(data).endswith("load average 2.5 at start, up to 9.2 after its aiperf runs")


def test_integrity_flags_short_or_failed_runs():
    ok = parse_export(sample())
    short = dict(ok, completed=15.0, errors=1)
    assert integrity_problems({"a": [ok]}, 16) == []
    assert integrity_problems({"a": [ok, short]}, 16) == ["a run 1: 15/16 completed, 1 error kinds"]


def test_cpu_between_interpolates_the_window():
    samples = [(10.0, 1.0), (11.0, 2.0), (12.0, 4.0)]
    assert cpu_between(samples, 10.5, 11.5) == pytest.approx(1.5)
    assert cpu_between(samples, 9.0, 13.0) == pytest.approx(3.0)  # clamped to the series


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_own_tree_is_found_and_burns_cpu():
    assert os.getpid() in descendants([os.getppid()])
    before = process_cpu_s(os.getpid())
    sum(i * i for i in range(200_000))
    assert process_cpu_s(os.getpid()) > before


def test_goals_against_the_faster_peer():
    runs = {"disagg-sglang": [{"output_tok_per_s": 90.0}, {"output_tok_per_s": 110.0}],
            "sglang-native-disagg": [{"output_tok_per_s": 100.0}, {"output_tok_per_s": 100.0}]}
    median = {"agg-sglang": {"output_tok_per_s": 100.0, "ttft_p50_ms": 50.0},
              "dynamo-sglang": {"output_tok_per_s": 80.0, "ttft_p50_ms": 60.0},
              "sglang-native": {"output_tok_per_s": 90.0, "ttft_p50_ms": 40.0},
              "disagg-sglang": {"output_tok_per_s": 95.0, "ttft_p50_ms": 400.0},
              "dynamo-sglang-disagg": {"output_tok_per_s": 90.0, "ttft_p50_ms": 500.0},
              "sglang-native-disagg": {"output_tok_per_s": 100.0, "ttft_p50_ms": 450.0}}
    goals = peer_goals(lambda name: {"median": median, "runs": runs})
    assert [(g.measured.split("x")[0], g.met) for g in goals] == [
        ("1.11", True), ("1.25", False), ("0.95", False), ("0.89", True)]
    assert "(the faster: sglang-native)" in goals[1].measured  # the lower TTFT is the faster
    assert goals[2].bound == ("against sglang-native-disagg, run by run this ratio went from "
                              "0.90x to 1.10x")
    assert [g.met for g in peer_goals(lambda name: None)] == [None] * 4


def test_the_prefill_process_bound_names_what_the_handlers_alone_cost():
    r = {"reference": DISAGG_REFERENCE, "process_cpu_per_token": {"prefill": 1.3}}
    handler = {"median_us": {"this worker": 160.0, "dynamo.sglang": 100.0},
               "parts_us": {"validating the request": 24.0}}
    medians = {"disagg-sglang": {"process_cpu_us_per_token": {"prefill": 65.0}},
               DISAGG_REFERENCE: {"process_cpu_us_per_token": {"prefill": 50.0}}}
    results = {"bench_aiperf": {"ratios": {"disagg-sglang": r}, "median": medians,
                                "config": {"output_tokens": 32}},
               "bench_prefill_handler": handler}
    goals = {g.what: g for g in aiperf_parity(results.get)}
    prefill = goals["aiperf: disagg-sglang prefill worker process's CPU per output token / "
                    "dynamo.sglang disagg's"]
    assert prefill.met is False
    assert ("spend 160 us per request against dynamo.sglang's 100 us (of this worker's: "
            "validating the request 24 us;" in prefill.bound)
    # 32 tokens a request: 2080 and 1600 us; the handlers make 60 us of the 480 between them
    assert ("spend 2080 and 1600 us per request: the handlers make 60 us of the 480 us"
            in prefill.bound)
    decode = goals["aiperf: disagg-sglang decode worker process's CPU per output token / "
                   "dynamo.sglang disagg's"]
    assert "bench_prefill_handler" not in (decode.bound or "")
