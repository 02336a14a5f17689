#!/usr/bin/env bash
# Disaggregated serving, decode-orchestrated:
#
#   client -> dynamo.frontend (HTTP) -> decode worker (registers the model; GPU 1)
#                                         -> prefill worker (private endpoint; GPU 0)
#             prefill pushes the prompt's KV cache into decode's memory over NIXL.
#
# With GPUs: both workers run SGLang (--disaggregation-transfer-backend nixl); --sglang-cpu runs
# SGLang's own CPU path instead. Without GPUs (or with --cpu / ENGINE=cpu): the same topology
# on the embedded CPU engine, by default on the project's `small` model (built on first use).
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
  --bootstrap-port N         prefill bootstrap port (default 8998)
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
(per-process logs), READY_TIMEOUT (s), PREFILL_GPU (0), DECODE_GPU (1), PYTHON.
Everything after -- is passed to both workers (SGLang flag names).
EOF
}

parse_launch_args "$@"
engine_defaults
ENGINE_ARGS+=(--disaggregation-transfer-backend nixl)
PREFILL_ENV=("${WORKER_ENV[@]}") DECODE_ENV=("${WORKER_ENV[@]}")
if [[ "$ENGINE" == sglang ]] && ! ((SGLANG_CPU)); then
    PREFILL_ENV=(env "CUDA_VISIBLE_DEVICES=${PREFILL_GPU:-0}")
    DECODE_ENV=(env "CUDA_VISIBLE_DEVICES=${DECODE_GPU:-1}")
fi
COMMON=(--model-path "$MODEL" --served-model-name "$SERVED" --host "$HOST"
        --disaggregation-bootstrap-port "$BOOTSTRAP_PORT" "${ENGINE_ARGS[@]}" "${DISCOVERY_ARGS[@]}")
((SKIP_TOKENIZER)) && COMMON+=(--skip-tokenizer-init)

FRONTEND_CMD=("$PYTHON" -m dynamo.frontend "${DISCOVERY_ARGS[@]}"
              --http-host "$HOST" --http-port "$HTTP_PORT")
PREFILL_CMD=("${PREFILL_ENV[@]}" "$PYTHON" -m components "${COMMON[@]}"
             --disaggregation-mode prefill "${EXTRA[@]}")
DECODE_CMD=("${DECODE_ENV[@]}" "$PYTHON" -m components "${COMMON[@]}"
            --disaggregation-mode decode "${EXTRA[@]}")

run_stack disaggregated frontend prefill decode
