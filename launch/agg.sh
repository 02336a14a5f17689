#!/usr/bin/env bash
# Aggregated serving: client -> dynamo.frontend (HTTP) -> one worker that prefills and decodes
# in one engine (no KV transfer).
#
# With GPUs: SGLang, on as many GPUs as its --tp/--dp/--pp-size need (--sglang-cpu: SGLang's own
# CPU path). Without (or with --cpu / ENGINE=cpu):
# the embedded CPU engine, by default on the project's `small` model (built on first use).
# File-based discovery by default (a fresh DYN_FILE_KV per run unless one is given): no etcd or
# NATS; --discovery-backend etcd / --request-plane nats use the operator's (launch/two-node.md).
set -Eeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<USAGE
Usage: $0 [options] [-- extra worker args]

  --model PATH               model path (GPU default: Qwen/Qwen3-0.6B; CPU: the small test model)
  --served-model-name NAME   name clients use (default: the model path; CPU default: small)
  --host ADDR                bind address for the frontend and side channels (default 127.0.0.1)
  --http-port N              frontend HTTP port (default 8000)
  --bootstrap-port N         accepted for symmetry with disagg.sh (unused when aggregated)
  --skip-tokenizer-init      token passthrough, the frontend tokenizes (default)
  --no-skip-tokenizer-init   text mode: the worker applies the chat template and tokenizes
  --cpu | --gpu              force the CPU engine / SGLang on GPUs (default: GPUs if present)
  --gpus LIST                the worker's GPUs, e.g. 0,1 (default: the first ones it needs)
  --sglang-cpu               SGLang's own CPU path (SGLANG_USE_CPU_ENGINE=1), no GPU needed
  --discovery-backend file|etcd   Dynamo discovery (default file: a fresh DYN_FILE_KV per run)
  --request-plane tcp|nats   Dynamo request plane (default tcp)
  --etcd-endpoints URL       etcd for --discovery-backend etcd (env ETCD_ENDPOINTS, default http://127.0.0.1:2379)
  --nats-server URL          NATS for --request-plane nats (env NATS_SERVER, default nats://127.0.0.1:4222)
  --dry-run                  print the commands and exit
  -h, --help                 this text

Environment: MODEL, HOST, HTTP_PORT, ENGINE=cpu|sglang, SGLANG_USE_CPU_ENGINE=1, DYN_FILE_KV,
DYN_DISCOVERY_BACKEND, DYN_REQUEST_PLANE, ETCD_ENDPOINTS, NATS_SERVER, LOG_DIR (per-process
logs), READY_TIMEOUT (s), PYTHON (default: .venv-gpu/bin/python on GPUs, .venv/bin/python on
CPU, else python3). Everything after -- is passed to the worker.

GPUs: the worker uses tp*pp GPUs, times dp without --enable-dp-attention. GPU indices count
within an existing CUDA_VISIBLE_DEVICES (kept, not overridden); the launch checks that enough
GPUs exist (CUDA_VISIBLE_DEVICES, else nvidia-smi -L) and, before starting, that PYTHON imports
sglang and sees CUDA ('make install-gpu' sets that up).
USAGE
}

# The agg-only option; the rest go to parse_launch_args.
GPU_LIST="" SHARED_ARGS=()
while (($#)); do
    case "$1" in
        --gpus) GPU_LIST="$2"; shift 2 ;;
        --) SHARED_ARGS+=("$@"); break ;;
        *) SHARED_ARGS+=("$1"); shift ;;
    esac
done
parse_launch_args "${SHARED_ARGS[@]}"
engine_defaults

# worker_gpus: WORKER_ENV names the worker's GPUs (--gpus, else the first it needs), checked
# against the GPUs that exist.
worker_gpus() {
    local per ids=() i top=-1
    per=$(gpus_per_worker "${EXTRA[@]}") || exit 2
    if [[ -n "$GPU_LIST" ]]; then
        gpu_list ids --gpus "$GPU_LIST"
        ((${#ids[@]} == per)) || { log "--gpus $GPU_LIST: the worker needs $per GPUs"; exit 2; }
    else
        for ((i = 0; i < per; i++)); do ids+=("$i"); done
    fi
    for i in "${ids[@]}"; do if ((i > top)); then top=$i; fi; done
    check_gpu_count $((top + 1)) "1 worker x $per"
    WORKER_ENV=(env "CUDA_VISIBLE_DEVICES=$(cuda_devices "${ids[@]}")")
}
((ON_GPUS)) && worker_gpus
WORKER_CMD=("${WORKER_ENV[@]}" "$PYTHON" -m components --model-path "$MODEL" --served-model-name "$SERVED"
            --host "$HOST" "${ENGINE_ARGS[@]}" "${DISCOVERY_ARGS[@]}" --disaggregation-mode null)
((SKIP_TOKENIZER)) && WORKER_CMD+=(--skip-tokenizer-init)
WORKER_CMD+=("${EXTRA[@]}")
FRONTEND_CMD=("$PYTHON" -m dynamo.frontend "${DISCOVERY_ARGS[@]}"
              --http-host "$HOST" --http-port "$HTTP_PORT")

run_stack aggregated frontend worker
