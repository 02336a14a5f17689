#!/usr/bin/env bash
# The request of chat_stream.py, with curl: one streamed chat completion (server-sent events).
#   examples/chat_curl.sh [base-url] [model]
set -euo pipefail
BASE_URL="${1:-http://127.0.0.1:8000/v1}"
MODEL="${2:-$(curl -sf "$BASE_URL/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')}"

curl -sN "$BASE_URL/chat/completions" \
    -H 'Content-Type: application/json' \
    -d @- <<JSON
{
  "model": "$MODEL",
  "messages": [{"role": "user", "content": "Tell me a short story about a robot."}],
  "max_tokens": 64,
  "stream": true,
  "stream_options": {"include_usage": true}
}
JSON
echo
