#!/usr/bin/env bash
# Disaggregated serving, decode-orchestrated:
#
#   client -> dynamo.frontend (HTTP) -> decode worker (registers the model; GPU 1)
#                                         -> prefill worker (private endpoint; GPU 0)
#             prefill pushes the prompt's KV cache into decode's memory over NIXL.
#
# With GPUs: both workers run SGLang (--disaggregation-transfer-backend nixl). Without GPUs
# (or with --cpu / ENGINE=cpu): the same topology on the embedded CPU engine, by default on the
# project's `small` model (built on first use). Discovery is file based (a fresh DYN_FILE_KV
# per run unless one is given), so no etcd or NATS is needed.
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
  --dry-run                  print the commands and exit
  -h, --help                 this text

Environment: MODEL, HOST, HTTP_PORT, BOOTSTRAP_PORT, ENGINE=cpu|sglang, DYN_FILE_KV, LOG_DIR
(per-process logs), READY_TIMEOUT (s), PREFILL_GPU (0), DECODE_GPU (1), PYTHON.
Everything after -- is passed to both workers (SGLang flag names).
EOF
}

MODEL="${MODEL:-}" SERVED="" HOST="${HOST:-127.0.0.1}" HTTP_PORT="${HTTP_PORT:-8000}"
BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}" SKIP_TOKENIZER=1 ENGINE="${ENGINE:-}" DRY_RUN=0
EXTRA=()
while (($#)); do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --served-model-name) SERVED="$2"; shift 2 ;;
        --host) HOST="$2"; shift 2 ;;
        --http-port) HTTP_PORT="$2"; shift 2 ;;
        --bootstrap-port) BOOTSTRAP_PORT="$2"; shift 2 ;;
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
    # --page-size 16 and --trust-remote-code as in Dynamo's SGLang launch scripts.
    ENGINE_ARGS=(--engine sglang --page-size 16 --trust-remote-code
                 --disaggregation-transfer-backend nixl)
    PREFILL_ENV=(env "CUDA_VISIBLE_DEVICES=${PREFILL_GPU:-0}")
    DECODE_ENV=(env "CUDA_VISIBLE_DEVICES=${DECODE_GPU:-1}")
    READY_TIMEOUT="${READY_TIMEOUT:-900}"
else
    if [[ -z "$MODEL" ]]; then
        MODEL=$( ((DRY_RUN)) && echo "$REPO_ROOT/.cache/models/small" || ensure_small_model)
        SERVED="${SERVED:-small}"
    fi
    ENGINE_ARGS=(--engine cpu --page-size 16 --disaggregation-transfer-backend nixl)
    PREFILL_ENV=(env) DECODE_ENV=(env)
    READY_TIMEOUT="${READY_TIMEOUT:-180}"
fi
SERVED="${SERVED:-$MODEL}"
COMMON=(--model-path "$MODEL" --served-model-name "$SERVED" --host "$HOST"
        --disaggregation-bootstrap-port "$BOOTSTRAP_PORT" "${ENGINE_ARGS[@]}")
((SKIP_TOKENIZER)) && COMMON+=(--skip-tokenizer-init)

FRONTEND_CMD=("$PYTHON" -m dynamo.frontend --discovery-backend file
              --http-host "$HOST" --http-port "$HTTP_PORT")
PREFILL_CMD=("${PREFILL_ENV[@]}" "$PYTHON" -m components "${COMMON[@]}"
             --disaggregation-mode prefill "${EXTRA[@]}")
DECODE_CMD=("${DECODE_ENV[@]}" "$PYTHON" -m components "${COMMON[@]}"
            --disaggregation-mode decode "${EXTRA[@]}")

if ((DRY_RUN)); then
    printf 'frontend:'; printf ' %q' "${FRONTEND_CMD[@]}"; echo
    printf 'prefill:'; printf ' %q' "${PREFILL_CMD[@]}"; echo
    printf 'decode:'; printf ' %q' "${DECODE_CMD[@]}"; echo
    exit 0
fi

cd "$REPO_ROOT"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
use_file_discovery
start frontend "${FRONTEND_CMD[@]}"
start prefill "${PREFILL_CMD[@]}"
start decode "${DECODE_CMD[@]}"
wait_ready "$HOST" "$HTTP_PORT" "$SERVED" "$READY_TIMEOUT"
log "ready: model $SERVED at http://$HOST:$HTTP_PORT/v1 ($ENGINE engine, disaggregated)"
wait_any
