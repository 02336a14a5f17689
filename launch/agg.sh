#!/usr/bin/env bash
# Aggregated serving: client -> dynamo.frontend (HTTP) -> one worker that prefills and decodes
# in one engine (no KV transfer).
#
# With a GPU: SGLang. Without (or with --cpu / ENGINE=cpu): the embedded CPU engine, by default
# on the project's `small` model (built on first use). File-based discovery (a fresh DYN_FILE_KV
# per run unless one is given): no etcd or NATS.
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
  --dry-run                  print the commands and exit
  -h, --help                 this text

Environment: MODEL, HOST, HTTP_PORT, ENGINE=cpu|sglang, DYN_FILE_KV, LOG_DIR (per-process
logs), READY_TIMEOUT (s), PYTHON. Everything after -- is passed to the worker.
USAGE
}

MODEL="${MODEL:-}" SERVED="" HOST="${HOST:-127.0.0.1}" HTTP_PORT="${HTTP_PORT:-8000}"
SKIP_TOKENIZER=1 ENGINE="${ENGINE:-}" DRY_RUN=0
EXTRA=()
while (($#)); do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --served-model-name) SERVED="$2"; shift 2 ;;
        --host) HOST="$2"; shift 2 ;;
        --http-port) HTTP_PORT="$2"; shift 2 ;;
        --bootstrap-port) shift 2 ;;
        --skip-tokenizer-init) SKIP_TOKENIZER=1; shift ;;
        --no-skip-tokenizer-init) SKIP_TOKENIZER=0; shift ;;
        --cpu) ENGINE=cpu; shift ;;
        --gpu) ENGINE=sglang; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) log "unknown option $1"; usage >&2; exit 2 ;;
    esac
done
if [[ -z "$ENGINE" ]]; then ENGINE=$(have_gpus && echo sglang || echo cpu); fi

if [[ "$ENGINE" == sglang ]]; then
    MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
    ENGINE_ARGS=(--engine sglang --page-size 16 --trust-remote-code)
    READY_TIMEOUT="${READY_TIMEOUT:-900}"
else
    if [[ -z "$MODEL" ]]; then
        MODEL=$( ((DRY_RUN)) && echo "$REPO_ROOT/.cache/models/small" || ensure_small_model)
        SERVED="${SERVED:-small}"
    fi
    ENGINE_ARGS=(--engine cpu --page-size 16)
    READY_TIMEOUT="${READY_TIMEOUT:-180}"
fi
SERVED="${SERVED:-$MODEL}"
WORKER_CMD=("$PYTHON" -m components --model-path "$MODEL" --served-model-name "$SERVED"
            --host "$HOST" "${ENGINE_ARGS[@]}" --disaggregation-mode null)
((SKIP_TOKENIZER)) && WORKER_CMD+=(--skip-tokenizer-init)
WORKER_CMD+=("${EXTRA[@]}")
FRONTEND_CMD=("$PYTHON" -m dynamo.frontend --discovery-backend file
              --http-host "$HOST" --http-port "$HTTP_PORT")

if ((DRY_RUN)); then
    printf 'frontend:'; printf ' %q' "${FRONTEND_CMD[@]}"; echo
    printf 'worker:'; printf ' %q' "${WORKER_CMD[@]}"; echo
    exit 0
fi

cd "$REPO_ROOT"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
use_file_discovery
start frontend "${FRONTEND_CMD[@]}"
start worker "${WORKER_CMD[@]}"
wait_ready "$HOST" "$HTTP_PORT" "$SERVED" "$READY_TIMEOUT"
log "ready: model $SERVED at http://$HOST:$HTTP_PORT/v1 ($ENGINE engine, aggregated)"
wait_any
