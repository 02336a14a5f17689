#!/usr/bin/env bash
# Disaggregated serving, in either orchestration style (docs/reference/orchestration.md):
#
#   frontend-orchestrated (Dynamo 1.6.1's style; the default in Tokens mode):
#     client -> dynamo.frontend (HTTP; its prefill router picks one prefill and one decode
#               worker and sends both the same bootstrap_info)
#               -> prefill worker(s) (register the model as Prefill; the first GPUs)
#               -> decode worker(s)  (register the model as Decode; the next GPUs)
#   decode-orchestrated (the default in Text mode):
#     client -> dynamo.frontend -> decode worker(s) (register the model)
#                                    -> prefill worker(s) (private endpoint)
#   Either way prefill pushes the prompt's KV cache into decode's memory over NIXL.
#
# With GPUs: both workers run SGLang (--disaggregation-transfer-backend nixl), each on as many
# GPUs as its own --tp/--dp/--pp-size need; --sglang-cpu runs SGLang's own CPU path instead.
# Without GPUs (or with --cpu / ENGINE=cpu): the same topology on the embedded CPU engine, by
# default on the project's `small` model (built on first use).
# Discovery is file based by default (a fresh DYN_FILE_KV per run unless one is given), so no
# etcd or NATS is needed; --discovery-backend etcd --request-plane nats use the operator's etcd and
# NATS (ETCD_ENDPOINTS, NATS_SERVER), as multi-node deployments do (launch/two-node.md).
set -Eeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<EOF
Usage: $0 [options] [-- extra worker args]

  --model PATH               model path (GPU default: Qwen/Qwen3-0.6B; CPU: the small test model)
  --served-model-name NAME   name clients use (default: the model path; CPU default: small)
  --host ADDR                bind address for the frontend and side channels (default 127.0.0.1)
  --http-port N              frontend HTTP port (default 8000)
  --bootstrap-port N         first prefill bootstrap port (default 8998; prefill i gets N+i)
  --disagg-orchestrator X    frontend (Dynamo 1.6.1's style, Tokens mode only) or decode;
                             default: frontend in Tokens mode, decode in Text mode
  --num-prefill N            prefill workers (default 1)
  --num-decode M             decode workers (default 1)
  --prefill-gpus LIST        GPUs of the prefill workers, e.g. 0,1 (worker i takes the i-th block
                             of its size); default: the first GPUs
  --decode-gpus LIST         GPUs of the decode workers; default: the GPUs after the prefills'
  --prefill-args "ARGS"      SGLang args for the prefill workers only (split as a shell would)
  --decode-args "ARGS"       SGLang args for the decode workers only, e.g.
                             "--kv-events-config '{\"publisher\":\"zmq\"}'"
  --skip-tokenizer-init      token passthrough, the frontend tokenizes (default)
  --no-skip-tokenizer-init   text mode: the workers apply the chat template and tokenize
  --cpu | --gpu              force the CPU engine / SGLang on GPUs (default: GPUs if present)
  --sglang-cpu               SGLang's own CPU path (SGLANG_USE_CPU_ENGINE=1), no GPU needed
  --discovery-backend file|etcd   Dynamo discovery (default file: a fresh DYN_FILE_KV per run)
  --request-plane tcp|nats   Dynamo request plane (default tcp)
  --etcd-endpoints URL       etcd for --discovery-backend etcd (env ETCD_ENDPOINTS, default http://127.0.0.1:2379)
  --nats-server URL          NATS for --request-plane nats (env NATS_SERVER, default nats://127.0.0.1:4222)
  --dry-run                  print the commands and exit
  -h, --help                 this text

Environment: MODEL, HOST, HTTP_PORT, BOOTSTRAP_PORT, ENGINE=cpu|sglang, SGLANG_USE_CPU_ENGINE=1,
DYN_FILE_KV, DYN_DISCOVERY_BACKEND, DYN_REQUEST_PLANE, ETCD_ENDPOINTS, NATS_SERVER, LOG_DIR
(per-process logs), READY_TIMEOUT (s), PREFILL_GPU / DECODE_GPU (first GPU of the default
blocks), PYTHON (default: .venv-gpu/bin/python on GPUs, .venv/bin/python on CPU, else python3).
Everything after -- is passed to both workers (SGLang flag names).

GPUs: a worker uses tp*pp GPUs, times dp without --enable-dp-attention (from its own args).
GPU indices count within an existing CUDA_VISIBLE_DEVICES (kept, not overridden); the launch
checks that enough GPUs exist (CUDA_VISIBLE_DEVICES, else nvidia-smi -L) and, before starting,
that PYTHON imports sglang and sees CUDA ('make install-gpu' sets that up).
EOF
}

# The disagg-only options; the rest go to parse_launch_args.
ORCHESTRATOR="" NUM_PREFILL=1 NUM_DECODE=1 SHARED_ARGS=() PREFILL_GPUS="" DECODE_GPUS=""
PREFILL_ARGS=() DECODE_ARGS=()
while (($#)); do
    case "$1" in
        --disagg-orchestrator) ORCHESTRATOR="$2"; shift 2 ;;
        --num-prefill) NUM_PREFILL="$2"; shift 2 ;;
        --num-decode) NUM_DECODE="$2"; shift 2 ;;
        --prefill-gpus) PREFILL_GPUS="$2"; shift 2 ;;
        --decode-gpus) DECODE_GPUS="$2"; shift 2 ;;
        --prefill-args) split_words PREFILL_ARGS "$2" --prefill-args; shift 2 ;;
        --decode-args) split_words DECODE_ARGS "$2" --decode-args; shift 2 ;;
        --) SHARED_ARGS+=("$@"); break ;;
        *) SHARED_ARGS+=("$1"); shift ;;
    esac
done
parse_launch_args "${SHARED_ARGS[@]}"
for count in "$NUM_PREFILL" "$NUM_DECODE"; do
    [[ "$count" =~ ^[1-9][0-9]*$ ]] || { log "--num-prefill/--num-decode must be >= 1, got $count"; exit 2; }
done
ORCHESTRATOR="${ORCHESTRATOR:-$( ((SKIP_TOKENIZER)) && echo frontend || echo decode)}"
case "$ORCHESTRATOR" in
    frontend) ((SKIP_TOKENIZER)) || {
        log "--disagg-orchestrator frontend needs Tokens mode (--skip-tokenizer-init)"; exit 2; } ;;
    decode) ;;
    *) log "--disagg-orchestrator must be frontend or decode, got $ORCHESTRATOR"; exit 2 ;;
esac
engine_defaults
ENGINE_ARGS+=(--disaggregation-transfer-backend nixl --disagg-orchestrator "$ORCHESTRATOR")
COMMON=(--model-path "$MODEL" --served-model-name "$SERVED" --host "$HOST" "${ENGINE_ARGS[@]}"
        "${DISCOVERY_ARGS[@]}")
((SKIP_TOKENIZER)) && COMMON+=(--skip-tokenizer-init)

# role_gpus ROLE COUNT PER FIRST LIST: ${ROLE}_GPU_IDS, the GPU indices of ROLE's COUNT workers
# of PER GPUs each, worker after worker: LIST (--ROLE-gpus) if given, else the block from FIRST.
role_gpus() {
    local role="$1" count="$2" per="$3" first="$4" list="$5" i
    local -n ids="${role^^}_GPU_IDS"
    ids=()
    if [[ -z "$list" ]]; then
        for ((i = first; i < first + count * per; i++)); do ids+=("$i"); done
        return 0
    fi
    gpu_list ids "--$role-gpus" "$list"
    if ((${#ids[@]} != count * per)); then
        log "--$role-gpus $list: $count $role worker(s) x $per GPUs need $((count * per)) GPUs"
        exit 2
    fi
}

# assign_gpus: PREFILL_GPU_IDS then DECODE_GPU_IDS (by default the block after the prefills'),
# sized from each role's own SGLang args and checked against the GPUs that exist.
assign_gpus() {
    PER_PREFILL=$(gpus_per_worker "${EXTRA[@]}" "${PREFILL_ARGS[@]}") || exit 2
    PER_DECODE=$(gpus_per_worker "${EXTRA[@]}" "${DECODE_ARGS[@]}") || exit 2
    role_gpus prefill "$NUM_PREFILL" "$PER_PREFILL" "${PREFILL_GPU:-0}" "$PREFILL_GPUS"
    local i top=-1
    for i in "${PREFILL_GPU_IDS[@]}"; do if ((i > top)); then top=$i; fi; done
    role_gpus decode "$NUM_DECODE" "$PER_DECODE" "${DECODE_GPU:-$((top + 1))}" "$DECODE_GPUS"
    local -A seen=()
    for i in "${PREFILL_GPU_IDS[@]}" "${DECODE_GPU_IDS[@]}"; do
        if ((i > top)); then top=$i; fi
        # Allowed (small models, a lowered --mem-fraction-static), rarely meant.
        [[ -n "${seen[$i]:-}" ]] && log "warning: GPU $i is given to more than one worker"
        seen[$i]=1
    done
    check_gpu_count $((top + 1)) \
        "$NUM_PREFILL prefill x $PER_PREFILL + $NUM_DECODE decode x $PER_DECODE"
}
((ON_GPUS)) && assign_gpus

FRONTEND_CMD=("$PYTHON" -m dynamo.frontend "${DISCOVERY_ARGS[@]}"
              --http-host "$HOST" --http-port "$HTTP_PORT")
NAMES=(frontend)

# worker_cmd ROLE INDEX: define ${NAME^^}_CMD for worker NAME (prefill, prefill_1, ...).
worker_cmd() {
    local role="$1" i="$2" name="$1"
    ((i)) && name="${role}_$i"
    local -n cmd="${name^^}_CMD" role_args="${role^^}_ARGS"
    local env=("${WORKER_ENV[@]}") port="$BOOTSTRAP_PORT"
    if ((ON_GPUS)); then
        local -n ids="${role^^}_GPU_IDS" per="PER_${role^^}"
        env=(env "CUDA_VISIBLE_DEVICES=$(cuda_devices "${ids[@]:i * per:per}")")
    fi
    # Each prefill's bootstrap server needs its own port. Decode binds none (it dials what the
    # prefill advertises); it gets the first one, as in Dynamo's own launch scripts.
    [[ "$role" == prefill ]] && port=$((BOOTSTRAP_PORT + i))
    cmd=("${env[@]}" "$PYTHON" -m components "${COMMON[@]}" --disaggregation-bootstrap-port "$port"
         --disaggregation-mode "$role" "${EXTRA[@]}" "${role_args[@]}")
    NAMES+=("$name")
}
for ((i = 0; i < NUM_PREFILL; i++)); do worker_cmd prefill "$i"; done
for ((i = 0; i < NUM_DECODE; i++)); do worker_cmd decode "$i"; done

# Frontend-orchestrated, the model is listed once a decode registers but served only once a
# prefill has registered too: ready means one request went through.
[[ "$ORCHESTRATOR" == frontend ]] && READY_PROBE=1
run_stack "disaggregated, $ORCHESTRATOR-orchestrated, $NUM_PREFILL prefill + $NUM_DECODE decode" \
    "${NAMES[@]}"
