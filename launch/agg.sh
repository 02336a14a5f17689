#!/usr/bin/env bash
# Aggregated serving: client -> dynamo.frontend (HTTP) -> one worker that prefills and decodes
# in one engine (no KV transfer).
#
# With a GPU: SGLang (--sglang-cpu: SGLang's own CPU path). Without (or with --cpu / ENGINE=cpu):
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
  --cpu | --gpu              force the CPU engine / SGLang on a GPU (default: GPU if present)
  --sglang-cpu               SGLang's own CPU path (SGLANG_USE_CPU_ENGINE=1), no GPU needed
  --discovery-backend file|etcd   Dynamo discovery (default file: a fresh DYN_FILE_KV per run)
  --request-plane tcp|nats   Dynamo request plane (default tcp)
  --etcd-endpoints URL       etcd for --discovery-backend etcd (env ETCD_ENDPOINTS, default http://127.0.0.1:2379)
  --nats-server URL          NATS for --request-plane nats (env NATS_SERVER, default nats://127.0.0.1:4222)
  --dry-run                  print the commands and exit
  -h, --help                 this text

Environment: MODEL, HOST, HTTP_PORT, ENGINE=cpu|sglang, SGLANG_USE_CPU_ENGINE=1, DYN_FILE_KV,
DYN_DISCOVERY_BACKEND, DYN_REQUEST_PLANE, ETCD_ENDPOINTS, NATS_SERVER, LOG_DIR (per-process
logs), READY_TIMEOUT (s), PYTHON. Everything after -- is passed to the worker.
USAGE
}

parse_launch_args "$@"
engine_defaults
WORKER_CMD=("${WORKER_ENV[@]}" "$PYTHON" -m components --model-path "$MODEL" --served-model-name "$SERVED"
            --host "$HOST" "${ENGINE_ARGS[@]}" "${DISCOVERY_ARGS[@]}" --disaggregation-mode null)
((SKIP_TOKENIZER)) && WORKER_CMD+=(--skip-tokenizer-init)
WORKER_CMD+=("${EXTRA[@]}")
FRONTEND_CMD=("$PYTHON" -m dynamo.frontend "${DISCOVERY_ARGS[@]}"
              --http-host "$HOST" --http-port "$HTTP_PORT")

run_stack aggregated frontend worker
