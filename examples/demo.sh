#!/usr/bin/env bash
# `make demo`: the disaggregated topology on the CPU engine with the project's small model
# (frontend + prefill worker + decode worker, KV over NIXL), one streamed chat completion,
# then everything is stopped. Process logs go to a temporary directory (kept on failure).
set -Eeuo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$([[ -x "$REPO_ROOT/.venv/bin/python" ]] && echo "$REPO_ROOT/.venv/bin/python" || echo python3)}"
PORT="${HTTP_PORT:-8000}"
export LOG_DIR="${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/demo-logs.XXXXXX")}"
READY_LINE="ready: model"

"$REPO_ROOT/launch/disagg.sh" --cpu --http-port "$PORT" "$@" 2>"$LOG_DIR/launch.log" &
LAUNCH=$!
stop() {
    kill -TERM "$LAUNCH" 2>/dev/null || true
    wait "$LAUNCH" 2>/dev/null || true
}
trap stop EXIT

echo "starting the CPU topology (logs: $LOG_DIR) ..."
for _ in $(seq 600); do
    grep -q "$READY_LINE" "$LOG_DIR/launch.log" 2>/dev/null && break
    if ! kill -0 "$LAUNCH" 2>/dev/null; then
        echo "launch failed:"; tail -n 20 "$LOG_DIR"/*.log; exit 1
    fi
    sleep 0.5
done
grep -q "$READY_LINE" "$LOG_DIR/launch.log" || { echo "not ready in time"; exit 1; }
grep "$READY_LINE" "$LOG_DIR/launch.log"

"$PYTHON" "$REPO_ROOT/examples/chat_stream.py" --base-url "http://127.0.0.1:$PORT/v1" \
    --prompt "Write a haiku about disaggregated inference." --max-tokens 48
echo "stopping ..."
