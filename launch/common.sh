# Shared by agg.sh and disagg.sh (sourced, not run). Process-group bookkeeping, readiness,
# model and engine defaults. Every process is started in its own session/process group and
# recorded; `cleanup` stops the groups (TERM, bounded wait, then KILL) and removes the
# discovery directory if this script created it.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$([[ -x "$REPO_ROOT/.venv/bin/python" ]] && echo "$REPO_ROOT/.venv/bin/python" || echo python3)}"
STOP_TIMEOUT="${STOP_TIMEOUT:-20}"
PIDS=()
CREATED_KV_DIR=""

log() { echo "[$(basename "$0")] $*" >&2; }

have_gpus() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

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

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    local pid deadline
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + STOP_TIMEOUT))
    for pid in "${PIDS[@]}"; do
        while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        if kill -0 -- "-$pid" 2>/dev/null; then
            log "process group $pid did not stop in ${STOP_TIMEOUT}s; killing it"
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
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

# The CPU default model: the project's `small` model, built on first use.
ensure_small_model() {
    local dir="$REPO_ROOT/.cache/models/small"
    if [[ ! -f "$dir/config.json" ]]; then
        log "building the small test model into $dir"
        (cd "$REPO_ROOT" && "$PYTHON" -m components.model_builder --size small --out "$dir") >&2
    fi
    echo "$dir"
}

# wait_ready HOST PORT MODEL TIMEOUT: until GET /v1/models lists MODEL; fails if a started
# process exits first or the time runs out.
wait_ready() {
    local url="http://$1:$2/v1/models" model="$3" deadline=$((SECONDS + $4)) pid
    while ((SECONDS < deadline)); do
        if curl -sf --max-time 2 "$url" 2>/dev/null | grep -qF "\"id\":\"$model\""; then
            return 0
        fi
        for pid in "${PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then log "process $pid exited during startup"; return 1; fi
        done
        sleep 0.5
    done
    log "model $model not listed on $url within $4s"
    return 1
}

# Block until any started process exits; report which, and return its status.
wait_any() {
    local rc=0
    wait -n "${PIDS[@]}" || rc=$?
    log "a process exited (status $rc); stopping the rest"
    return "$rc"
}
