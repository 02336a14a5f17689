#!/usr/bin/env bash
# `make bench`: every benchmark, one after another (run together they would disturb each other on
# 2 cores). Each prints its table and writes JSON + PNG to results/ (or $BENCH_RESULTS); the
# tables are collected in results/summary.md. About 33 minutes on 2 cores (BENCH_AIPERF_REQUESTS
# sizes aiperf: measured requests per run).
#   bash benchmarks/run_all.sh             # the full run
#   bash benchmarks/run_all.sh --quick     # smoke run: small sizes, 1 repetition (~6 minutes)
#   bash benchmarks/run_all.sh --publish   # full run, then copy PNG + JSON to docs/bench/ and
#                                          # regenerate docs/benchmarks.md from them
set -Eeuo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${BENCH_RESULTS:-results}
QUICK=0
PUBLISH=0
for arg in "$@"; do
    case "$arg" in
        --quick) QUICK=1 ;;
        --publish) PUBLISH=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
# On tiny, both disaggregation styles (docs/reference/orchestration.md): what each costs the
# serving path.
TINY_ARMS=engine,agg,agg-chunked,disagg,disagg-decode

"$PY" -m components.model_builder --size tiny --out .cache/models/tiny-seed0 --if-missing
"$PY" -m components.model_builder --size small --out .cache/models/small-seed0 --if-missing

if [[ $QUICK == 1 ]]; then
    STREAM_ARGS=(--runs 1 --sizes 1000,4000)
    PREPROCESS_ARGS=(--runs 1)
    KV_ARGS=(--runs 3)
    TTFT_ARGS=(--runs 1 --lengths 128,1024)
    ENGINE_ARGS=(--runs 1)
    LOGPROBS_ARGS=(--runs 1)
    VS_HF_ARGS=(--runs 1 --new-tokens 16)
    TW_ARGS=(--runs 1 --tokens 16384)
    CONSTRAINED_ARGS=(--runs 1)
    SERVING_ARGS=(--quick)
    SERVING_TINY_ARGS=(--quick --tag tiny --model-path .cache/models/tiny-seed0
                       --arms "$TINY_ARMS")
    CHOICES_ARGS=(--runs 1 --n 4 --prompt-len 256)
    CHOICES_SGLANG_ARGS=(--runs 3)
    TOKEN_CPU_ARGS=(--quick)
    IDLE_ARGS=(--window 5 --arms cpu,floor)
    PREFIX_ARGS=(--runs 1)
    MULTI_TURN_ARGS=(--conversations 1 --turns 3)
    KV_ROUTING_ARGS=(--runs 1 --prefixes 4)
    # aiperf's size knob: measured requests per aiperf run (BENCH_AIPERF_REQUESTS).
    AIPERF_ARGS=(--runs 1 --requests "${BENCH_AIPERF_REQUESTS:-16}")
    PREFILL_HANDLER_ARGS=(--rounds 2 --requests 500)
else
    STREAM_ARGS=(--runs 3)
    PREPROCESS_ARGS=(--runs 3)
    KV_ARGS=(--runs 3)
    TTFT_ARGS=(--runs 3)
    ENGINE_ARGS=(--runs 3)
    LOGPROBS_ARGS=(--runs 3)
    VS_HF_ARGS=(--runs 3)
    TW_ARGS=(--runs 3)
    CONSTRAINED_ARGS=(--runs 3)
    SERVING_ARGS=(--runs 3 --concurrency 1,16)
    SERVING_TINY_ARGS=(--runs 3 --tag tiny --model-path .cache/models/tiny-seed0
                       --request-rate 8 --open-loop-requests 32 --arms "$TINY_ARMS")
    CHOICES_ARGS=(--runs 3)
    CHOICES_SGLANG_ARGS=(--runs 20)
    TOKEN_CPU_ARGS=(--runs 3 --requests-per-client 3)
    IDLE_ARGS=(--window 12)
    PREFIX_ARGS=(--runs 3)
    MULTI_TURN_ARGS=(--conversations 3 --turns 6)
    KV_ROUTING_ARGS=(--runs 3 --prefixes 4)
    AIPERF_ARGS=(--runs 3 --requests "${BENCH_AIPERF_REQUESTS:-64}")
    PREFILL_HANDLER_ARGS=(--rounds 6)
fi

failed=()
total_start=$(date +%s)
run() {  # run LABEL MODULE [ARGS...]
    local name=$1 module=$2; shift 2
    local start; start=$(date +%s)
    echo
    echo "=================== $name ==================="
    if "$PY" -m "benchmarks.$module" --out "$OUT" "$@" 2>&1 | tee "$OUT/$name.log"; then
        echo "=== $name: done in $(( $(date +%s) - start )) s"
    else
        echo "=== $name: FAILED after $(( $(date +%s) - start )) s (log: $OUT/$name.log)"
        failed+=("$name")
    fi
}

run stream_overhead bench_stream_overhead "${STREAM_ARGS[@]}"
run preprocess_loop bench_preprocess_loop "${PREPROCESS_ARGS[@]}"
run bench_kv_transfer bench_kv_transfer "${KV_ARGS[@]}"
run disagg_ttft bench_disagg_ttft "${TTFT_ARGS[@]}"
run serving_tiny bench_serving "${SERVING_TINY_ARGS[@]}"
run token_cpu bench_token_cpu "${TOKEN_CPU_ARGS[@]}"
run idle_cpu bench_idle_cpu "${IDLE_ARGS[@]}"
# NVIDIA aiperf against this worker, Dynamo 1.6.1's dynamo.sglang and SGLang's own server behind
# smg (`make aiperf`, `make smg` and `make bench-deps` install what it needs).
run bench_aiperf bench_aiperf "${AIPERF_ARGS[@]}"
# The prefill handlers alone, this worker's and dynamo.sglang's (a bound on bench_aiperf's goal).
run prefill_handler bench_prefill_handler "${PREFILL_HANDLER_ARGS[@]}"
run serving bench_serving "${SERVING_ARGS[@]}"
run bench_engine bench_engine "${ENGINE_ARGS[@]}"
run bench_logprobs bench_logprobs "${LOGPROBS_ARGS[@]}"
run vs_transformers bench_vs_transformers "${VS_HF_ARGS[@]}"
run bench_choices bench_choices "${CHOICES_ARGS[@]}"
run bench_choices_sglang bench_choices_sglang "${CHOICES_SGLANG_ARGS[@]}"
run tokenizer_workers bench_tokenizer_workers "${TW_ARGS[@]}"
run bench_constrained bench_constrained "${CONSTRAINED_ARGS[@]}"
run bench_prefix_cache bench_prefix_cache "${PREFIX_ARGS[@]}"
# Multi-turn chats resending their history: the KV each disaggregated turn sends again.
run multi_turn bench_multi_turn "${MULTI_TURN_ARGS[@]}"
run multi_turn_sglang bench_multi_turn --engine sglang "${MULTI_TURN_ARGS[@]}"
# Both arms, aggregated and disaggregated (bench_kv_routing.json, bench_kv_routing_disagg.json).
run bench_kv_routing bench_kv_routing "${KV_ROUTING_ARGS[@]}"

"$PY" -m benchmarks.summary --out "$OUT" > "$OUT/summary.md"
echo
echo "all benchmarks: $(( $(date +%s) - total_start )) s; tables in $OUT/summary.md"

if [[ $PUBLISH == 1 ]]; then
    mkdir -p docs/bench
    cp "$OUT"/*.png "$OUT"/*.json docs/bench/
    "$PY" -m benchmarks.summary --docs docs/benchmarks.md
    echo "copied PNG and JSON to docs/bench/ and regenerated docs/benchmarks.md"
fi

if (( ${#failed[@]} )); then
    echo "FAILED: ${failed[*]}" >&2
    exit 1
fi
