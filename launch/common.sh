# Shared by agg.sh and disagg.sh (sourced, not run). Process-group bookkeeping, readiness,
# model and engine defaults. Every process is started in its own session/process group and
# recorded; `cleanup` stops the groups (TERM, bounded wait, then KILL) and removes the
# discovery directory if this script created it.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USER_PYTHON="${PYTHON:-}"  # PYTHON itself is chosen once the engine is known (choose_python)
STOP_TIMEOUT="${STOP_TIMEOUT:-45}"  # a worker: 5 s grace + 30 s drain + ending the rest
PIDS=()
CREATED_KV_DIR=""

log() { echo "[$(basename "$0")] $*" >&2; }

source "$REPO_ROOT/launch/gpus.sh"

# start NAME CMD...: run CMD in a new session (its own process group), output to
# $LOG_DIR/NAME.log when LOG_DIR is set, else to this terminal.
start() {
    local name="$1"; shift
    log "starting $name: $*"
    if [[ -n "${LOG_DIR:-}" ]]; then
        mkdir -p "$LOG_DIR"
        setsid "$@" >"$LOG_DIR/$name.log" 2>&1 &
    else
        setsid "$@" &
    fi
    PIDS+=("$!")
}

# TERM goes to each started process itself, not its group: a worker unregisters, drains and
# then stops its engine's subprocesses (SGLang's scheduler and detokenizer share its group and
# would die mid-request if signalled too). Whatever is left in a group once its leader is gone
# or past the bound is killed.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local pid deadline
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + STOP_TIMEOUT))
    for pid in "${PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            log "process $pid did not stop in ${STOP_TIMEOUT}s; killing its group"
        fi
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    [[ -n "$CREATED_KV_DIR" ]] && rm -rf "$CREATED_KV_DIR"
    log "stopped"
    exit "$rc"
}

# A fresh discovery directory per run unless the caller chose one.
use_file_discovery() {
    if [[ -z "${DYN_FILE_KV:-}" ]]; then
        CREATED_KV_DIR="$(mktemp -d "${TMPDIR:-/tmp}/dynamo-kv.XXXXXX")"
        export DYN_FILE_KV="$CREATED_KV_DIR"
    fi
    export DYN_DISCOVERY_BACKEND=file
}

# The CPU default model: the project's `small` model, built on first use (the same cache
# directory as the tests' and benchmarks').
SMALL_MODEL_DIR="$REPO_ROOT/.cache/models/small-seed0"
ensure_small_model() {
    if ((DRY_RUN)); then echo "$SMALL_MODEL_DIR"; return; fi
    log "using the small test model in $SMALL_MODEL_DIR (built if missing)"
    (cd "$REPO_ROOT" && "$PYTHON" -m components.model_builder --size small \
        --out "$SMALL_MODEL_DIR" --if-missing) >&2
    echo "$SMALL_MODEL_DIR"
}

# parse_launch_args ARGS...: the options agg.sh and disagg.sh share (their usage texts say
# which). Sets MODEL SERVED HOST HTTP_PORT BOOTSTRAP_PORT SKIP_TOKENIZER ENGINE SGLANG_CPU ON_GPUS
# DRY_RUN EXTRA PYTHON.
parse_launch_args() {
    MODEL="${MODEL:-}" SERVED="" HOST="${HOST:-127.0.0.1}" HTTP_PORT="${HTTP_PORT:-8000}"
    BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}" SKIP_TOKENIZER=1 ENGINE="${ENGINE:-}" DRY_RUN=0
    SGLANG_CPU=0 DISCOVERY="${DYN_DISCOVERY_BACKEND:-file}" REQUEST_PLANE="${DYN_REQUEST_PLANE:-tcp}"
    [[ "${SGLANG_USE_CPU_ENGINE:-}" == 1 ]] && SGLANG_CPU=1
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
            --sglang-cpu) ENGINE=sglang; SGLANG_CPU=1; shift ;;
            --discovery-backend) DISCOVERY="$2"; shift 2 ;;
            --request-plane) REQUEST_PLANE="$2"; shift 2 ;;
            --etcd-endpoints) export ETCD_ENDPOINTS="$2"; shift 2 ;;
            --nats-server) export NATS_SERVER="$2"; shift 2 ;;
            --dry-run) DRY_RUN=1; shift ;;
            -h|--help) usage; exit 0 ;;
            --) shift; EXTRA=("$@"); break ;;
            *) log "unknown option $1"; usage >&2; exit 2 ;;
        esac
    done
    if [[ -z "$ENGINE" ]]; then ENGINE=$(have_gpus && echo sglang || echo cpu); fi
    if ((SGLANG_CPU)); then ENGINE=sglang; fi
    ON_GPUS=0
    [[ "$ENGINE" == sglang ]] && ! ((SGLANG_CPU)) && ON_GPUS=1
    choose_python
    discovery_args
}

# discovery_args: DISCOVERY_ARGS for the frontend and every worker (Dynamo's flag names). etcd and
# NATS are found through Dynamo's own variables, ETCD_ENDPOINTS and NATS_SERVER (defaults
# http://127.0.0.1:2379 and nats://127.0.0.1:4222), exported to every process.
discovery_args() {
    case "$DISCOVERY" in file|etcd) ;; *) log "--discovery-backend must be file or etcd"; exit 2 ;; esac
    case "$REQUEST_PLANE" in tcp|nats) ;; *) log "--request-plane must be tcp or nats"; exit 2 ;; esac
    DISCOVERY_ARGS=(--discovery-backend "$DISCOVERY" --request-plane "$REQUEST_PLANE")
}

# discovery_env: etcd and NATS are the operator's, and every process must reach the same ones
# (--dry-run prints where). File discovery gets a fresh directory when the stack starts.
discovery_env() {
    export DYN_DISCOVERY_BACKEND="$DISCOVERY" DYN_REQUEST_PLANE="$REQUEST_PLANE"
    if [[ "$DISCOVERY" == etcd ]]; then export ETCD_ENDPOINTS="${ETCD_ENDPOINTS:-http://127.0.0.1:2379}"; fi
    if [[ "$REQUEST_PLANE" == nats ]]; then export NATS_SERVER="${NATS_SERVER:-nats://127.0.0.1:4222}"; fi
    # The frontend's response-stream server (workers' answers come back to it) on --host too;
    # the workers do the same themselves.
    if [[ "$HOST" != 0.0.0.0 && "$HOST" != "::" ]]; then
        export DYN_TCP_RESPONSE_STREAM_HOST="${DYN_TCP_RESPONSE_STREAM_HOST:-$HOST}"
    fi
}

# sglang_cpu_env: WORKER_ENV for SGLang's own CPU path: SGLang's switch and, where SGLang's CPU
# kernels (`sgl_kernel`) are not installed, the project's test-only stand-ins on the workers' path.
sglang_cpu_env() {
    WORKER_ENV=(env SGLANG_USE_CPU_ENGINE=1)
    if ! "$PYTHON" -c 'import sgl_kernel' 2>/dev/null; then
        ((DRY_RUN)) || log "sgl_kernel is not installed: using the test-only stand-ins in tests/support/sglang_cpu"
        WORKER_ENV+=("PYTHONPATH=$REPO_ROOT/tests/support/sglang_cpu${PYTHONPATH:+:$PYTHONPATH}")
    fi
}

# engine_defaults: model, served name, engine flags, worker environment and start-up bound for
# $ENGINE. Sets ENGINE_ARGS, WORKER_ENV and READY_TIMEOUT.
engine_defaults() {
    WORKER_ENV=(env)
    if [[ "$ENGINE" == sglang ]] && ((SGLANG_CPU)); then
        if [[ -z "$MODEL" ]]; then
            MODEL=$(ensure_small_model)
            SERVED="${SERVED:-small}"
        fi
        ENGINE_ARGS=(--engine sglang --page-size 16)
        READY_TIMEOUT="${READY_TIMEOUT:-300}"
        sglang_cpu_env
    elif [[ "$ENGINE" == sglang ]]; then
        MODEL="${MODEL:-Qwen/Qwen3-0.6B}"
        # --page-size 16 and --trust-remote-code as in Dynamo's SGLang launch scripts.
        ENGINE_ARGS=(--engine sglang --page-size 16 --trust-remote-code)
        READY_TIMEOUT="${READY_TIMEOUT:-900}"
    else
        if [[ -z "$MODEL" ]]; then
            MODEL=$(ensure_small_model)
            SERVED="${SERVED:-small}"
        fi
        ENGINE_ARGS=(--engine cpu --page-size 16)
        READY_TIMEOUT="${READY_TIMEOUT:-180}"
    fi
    SERVED="${SERVED:-$MODEL}"
}

# run_stack DESCRIPTION NAME CMD_ARRAY_NAME...: print the commands (--dry-run), or start them
# in order, say ready once the model is served, and stop everything when one exits.
run_stack() {
    local what="$1" name; shift
    if ((DRY_RUN)); then
        discovery_env
        local env=("DYN_DISCOVERY_BACKEND=$DISCOVERY" "DYN_REQUEST_PLANE=$REQUEST_PLANE")
        [[ "$DISCOVERY" == etcd ]] && env+=("ETCD_ENDPOINTS=$ETCD_ENDPOINTS")
        [[ "$REQUEST_PLANE" == nats ]] && env+=("NATS_SERVER=$NATS_SERVER")
        { printf 'env:'; printf ' %q' "${env[@]}"; echo; } >&2  # stdout: the commands alone
        for name in "$@"; do
            local -n cmd="${name^^}_CMD"
            printf '%s:' "$name"; printf ' %q' "${cmd[@]}"; echo
        done
        exit 0
    fi
    cd "$REPO_ROOT"
    if ((ON_GPUS)); then check_gpu_python; fi  # as the workers will import it, from here
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    discovery_env
    if [[ "$DISCOVERY" == file ]]; then use_file_discovery; fi
    for name in "$@"; do
        local -n cmd="${name^^}_CMD"
        start "$name" "${cmd[@]}"
    done
    wait_ready "$HOST" "$HTTP_PORT" "$SERVED" "$READY_TIMEOUT"
    if ((${READY_PROBE:-0})); then wait_served "$HOST" "$HTTP_PORT" "$SERVED" "$READY_TIMEOUT"; fi
    log "ready: model $SERVED at http://$HOST:$HTTP_PORT/v1 ($ENGINE engine, $what)"
    wait_any
}

# started_alive: fails (and says which) if a process started by run_stack has exited.
started_alive() {
    local pid
    for pid in "${PIDS[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then log "process $pid exited during startup"; return 1; fi
    done
}

# wait_ready HOST PORT MODEL TIMEOUT: until GET /v1/models lists MODEL; fails if a started
# process exits first or the time runs out.
wait_ready() {
    local url="http://$1:$2/v1/models" model="$3" deadline=$((SECONDS + $4))
    while ((SECONDS < deadline)); do
        if curl -sf --max-time 2 "$url" 2>/dev/null | grep -qF "\"id\":\"$model\""; then
            return 0
        fi
        started_alive || return 1
        sleep 0.5
    done
    log "model $model not listed on $url within $4s"
    return 1
}

# wait_served HOST PORT MODEL TIMEOUT: until a one-token chat to MODEL answers 200.
wait_served() {
    local url="http://$1:$2/v1/chat/completions" deadline=$((SECONDS + $4))
    local body="{\"model\":\"$3\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"ready?\"}]}"
    while ((SECONDS < deadline)); do
        if curl -sf --max-time 30 -H 'Content-Type: application/json' -d "$body" "$url" \
                >/dev/null 2>&1; then
            return 0
        fi
        started_alive || return 1
        sleep 0.5
    done
    log "model $3 not served on $url within $4s"
    return 1
}

# Block until any started process exits; report which, and return its status.
wait_any() {
    local rc=0
    wait -n "${PIDS[@]}" || rc=$?
    log "a process exited (status $rc); stopping the rest"
    return "$rc"
}
