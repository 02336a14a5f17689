"""The embedded CPU engine against the real SGLang engine (on CPU): the same scripted requests
through the Engine API (`tests/support/engine_contract_probe.py`, one process per engine, the two
running side by side, each building an engine per input mode in turn), compared on chunk keys, incremental vs cumulative fields, meta_info fields, finish reasons, how
errors and aborts surface, and n > 1. Cases marked xfail are where the CPU engine does not yet behave
like SGLang; the handlers are written for SGLang's behaviour.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.topology import REPO, engine_env
from tests.support.engine_contract_probe import MODES as PROBE_MODES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CPU_DIFFERS = "the CPU engine differs from SGLang here"
MODES = tuple(PROBE_MODES)


def start_probe(engine: str, model: str, out: Path) -> subprocess.Popen:
    """The probe of `engine` for every mode, its output in files (two run at once)."""
    argv = [sys.executable, "-m", "tests.support.engine_contract_probe", "--engine", engine,
            "--model", model, "--modes", ",".join(MODES)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **engine_env(engine)}
    with open(out / f"{engine}.out", "w") as stdout, open(out / f"{engine}.err", "w") as stderr:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=stdout, stderr=stderr, text=True)


def probe_results(proc: subprocess.Popen, engine: str, out: Path) -> dict[str, dict]:
    """mode -> what the probe of `engine` saw."""
    code = proc.wait(timeout=300)
    lines = (out / f"{engine}.out").read_text().splitlines()
    found = dict(line[len("CONTRACT "):].split(" ", 1) for line in lines
                 if line.startswith("CONTRACT "))
    assert code == 0 and set(found) == set(MODES), (out / f"{engine}.err").read_text()[-3000:]
    return {mode: json.loads(result) for mode, result in found.items()}


@pytest.fixture(scope="module")
def probes(tmp_path_factory, tiny_model_path) -> dict[str, dict[str, dict]]:
    out = tmp_path_factory.mktemp("engine-contract")
    procs = {engine: start_probe(engine, tiny_model_path, out) for engine in ("cpu", "sglang")}
    try:
        return {engine: probe_results(proc, engine, out) for engine, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()  # a no-op once it has exited; else a failure left it running


@pytest.fixture(scope="module", params=MODES)
def runs(request, probes) -> dict:
    return {"cpu": probes["cpu"][request.param], "sglang": probes["sglang"][request.param],
            "mode": request.param}


@pytest.mark.parametrize("case", ["stream", "whole", "abort_after_first"])
def test_same_chunk_keys(runs, case):
    assert runs["cpu"][case]["chunk_keys"] == runs["sglang"][case]["chunk_keys"]
    expected = ["meta_info", "output_ids"] + ([] if runs["mode"] == "tokens" else ["text"])
    assert runs["sglang"][case]["chunk_keys"] == expected


def test_streamed_ids_and_text_are_incremental_counts_cumulative(runs):
    for engine in ("cpu", "sglang"):
        got = runs[engine]["stream"]
        # One token a chunk, or several where a slow reader let chunks queue up: both engines
        # read a backlog as one chunk (SGLang's TokenizerManager coalesces it too).
        per_chunk = got["ids_per_chunk"]
        assert sum(per_chunk) == 6 and min(per_chunk) >= 1, (engine, per_chunk)
        running = [sum(per_chunk[:i + 1]) for i in range(len(per_chunk))]
        assert got["completion_tokens"] == running, engine
    assert runs["cpu"]["stream"]["ids"] == runs["sglang"]["stream"]["ids"]  # greedy, same model
    assert runs["cpu"]["whole"]["ids"] == runs["sglang"]["stream"]["ids"]
    if runs["mode"] == "text":
        joined = {e: "".join(runs[e]["stream"]["texts"]) for e in ("cpu", "sglang")}
        assert joined["cpu"] == joined["sglang"] == runs["sglang"]["whole"]["texts"][0]
        assert "".join(runs["cpu"]["text_in"]["texts"]) == "".join(
            runs["sglang"]["text_in"]["texts"])


def test_finish_reason_is_none_until_the_last_chunk(runs):
    for engine in ("cpu", "sglang"):
        reasons = runs[engine]["stream"]["finish_reasons"]
        assert reasons[:-1] == [None] * (len(reasons) - 1), engine  # a backlog: fewer chunks
        assert reasons[-1] == {"type": "length", "length": 6}, engine


def test_abort_after_the_first_chunk_ends_with_an_abort_without_status(runs):
    for engine in ("cpu", "sglang"):
        last = runs[engine]["abort_after_first"]["finish_reasons"][-1]
        assert (last["type"], last["status_code"]) == ("abort", None), engine
        assert runs[engine]["abort_after_first"]["raised"] is None


@pytest.mark.xfail(strict=True, reason=f"{CPU_DIFFERS}: meta_info lacks SGLang's extra fields")
def test_meta_info_fields(runs):
    for key in ("meta_keys_first", "meta_keys_last"):
        assert runs["cpu"]["stream"][key] == runs["sglang"]["stream"][key]


@pytest.mark.parametrize("case", ["bad_top_k", "too_long"])
def test_sglang_raises_value_error_on_the_first_read(runs, case):
    got = runs["sglang"][case]
    assert (got["raised"], got["chunk_keys"]) == ("ValueError", [])


@pytest.mark.parametrize("case", ["bad_top_k", "too_long"])
def test_cpu_engine_raises_like_sglang(runs, case):
    assert runs["cpu"][case]["raised"] == "ValueError"
    assert runs["cpu"][case]["message"] == runs["sglang"][case]["message"]


def test_sglang_sends_the_request_on_the_first_read(runs):
    """An abort before the first read names an rid SGLang does not know yet: ignored."""
    got = runs["sglang"]["abort_before_first"]
    assert got["finish_reasons"][-1] == {"type": "length", "length": 400}


def test_cpu_engine_sends_on_first_read_like_sglang(runs):
    assert runs["cpu"]["abort_before_first"]["finish_reasons"][-1]["type"] == "length"


def test_sglang_n2_runs_one_sub_request_per_choice(runs):
    got = runs["sglang"]["n2"]
    assert got["indexes"] == [0, 1] and len(got["meta_ids"]) == 2
    assert got["finish_by_index"] == {i: {"type": "length", "length": 6} for i in ("0", "1")}


def test_cpu_engine_runs_n2_like_sglang(runs):
    cpu, sglang = runs["cpu"]["n2"], runs["sglang"]["n2"]
    assert cpu["indexes"] == sglang["indexes"] == [0, 1]
    assert len(cpu["meta_ids"]) == 2 and cpu["raised"] is None
    assert cpu["chunk_keys"] == sglang["chunk_keys"]
    assert cpu["finish_by_index"] == sglang["finish_by_index"]


def test_structured_output_same_tokens_and_errors_as_sglang(runs):
    """Text mode: both engines mask with xgrammar, so greedy constrained output is the same
    tokens, ending on the model's EOS. A schema xgrammar refuses: SGLang's scheduler finds it
    after the request went in and ends the stream with a 400 abort chunk; the CPU engine
    compiles before submitting and raises ValueError on the first read, as for every request it
    refuses up front. The handlers turn both into the same 400 with xgrammar's words."""
    if runs["mode"] == "tokens":
        pytest.skip("SGLang 0.5.23 builds no grammar backend with skip_tokenizer_init")
    cpu, sgl = runs["cpu"]["json_greedy"], runs["sglang"]["json_greedy"]
    assert cpu["raised"] is None and sgl["raised"] is None
    assert cpu["ids"] == sgl["ids"]
    assert cpu["finish_reasons"][-1] == sgl["finish_reasons"][-1]
    assert cpu["finish_reasons"][-1]["type"] == "stop"
    sgl_abort = runs["sglang"]["bad_schema"]["finish_reasons"][-1]
    assert (sgl_abort["type"], sgl_abort["status_code"]) == ("abort", 400)
    cpu_bad = runs["cpu"]["bad_schema"]
    assert (cpu_bad["raised"], cpu_bad["chunk_keys"]) == ("ValueError", [])
    for message in (sgl_abort["message"], cpu_bad["message"]):
        assert message.startswith("Failed to compile json grammar: ")
        assert 'Unsupported type "nonsense"' in message
