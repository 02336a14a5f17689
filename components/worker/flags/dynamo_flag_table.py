"""The tables of Dynamo 1.6.1's worker flags that `dynamo_flags.py` accepts or refuses: which
environment variable each runtime flag sets, which flags 1.6.1's LLM worker never reads, and
why each refused flag is refused (docs/compatibility.md, "Launch line")."""

from __future__ import annotations

DEFAULT_ENDPOINT_TYPES = "chat,completions"
NOT_TEXT_LLM = "this worker serves text LLMs only (no multimodal, embedding or generation roles)"

# Flags whose 1.6.1 meaning is an environment variable Dynamo's Rust runtime reads: set the same
# variable, before the runtime starts (Dynamo's DynamoRuntimeConfig.validate does the same).
ENV_FLAGS = {
    "--tcp-tls-cert-path": "DYN_TCP_TLS_CERT_PATH",
    "--tcp-tls-key-path": "DYN_TCP_TLS_KEY_PATH",
    "--tcp-tls-ca-cert-path": "DYN_TCP_TLS_CA_CERT_PATH",
    "--tcp-tls-server-name": "DYN_TCP_TLS_SERVER_NAME",
    "--tcp-tls-handshake-timeout": "DYN_TCP_TLS_HANDSHAKE_TIMEOUT_SECS",
    "--tcp-tls-client-cert-path": "DYN_TCP_TLS_CLIENT_CERT_PATH",
    "--tcp-tls-client-key-path": "DYN_TCP_TLS_CLIENT_KEY_PATH",
    "--tcp-tls-client-ca-cert-path": "DYN_TCP_TLS_CLIENT_CA_CERT_PATH",
    "--nats-tls-ca-cert-path": "NATS_TLS_CA_CERT_PATH",
    "--nats-tls-client-cert-path": "NATS_TLS_CLIENT_CERT_PATH",
    "--nats-tls-client-key-path": "NATS_TLS_CLIENT_KEY_PATH",
}
ENV_SWITCHES = {"--tcp-tls-insecure": "DYN_TCP_TLS_INSECURE",
                "--nats-tls-insecure": "NATS_TLS_INSECURE"}

# Flags 1.6.1's SGLang LLM worker parses and never reads (other backends' or diffusion-only
# settings): accepting them without effect is their 1.6.1 meaning here.
IGNORED = ("--connector", "--media-output-fs-url", "--media-output-http-url",
           "--health-check-payload")

# flag -> why it is refused. Booleans (nargs 0) also have an accepted `--no-` form.
REFUSED_SWITCHES = {
    "--fpm-trace": "forward-pass metrics traces are not implemented",
    "--multimodal-embedding-cache-publisher": NOT_TEXT_LLM,
    "--enable-multimodal": NOT_TEXT_LLM,
    "--dedicated-mm-encoder": NOT_TEXT_LLM,
    "--embedding-worker": NOT_TEXT_LLM,
    "--rerank-worker": NOT_TEXT_LLM,
    "--image-diffusion-worker": NOT_TEXT_LLM,
    "--video-generation-worker": NOT_TEXT_LLM,
    "--frontend-decoding": "frontend media decoding is multimodal; " + NOT_TEXT_LLM,
    "--enable-rl": "RL metadata upload is not implemented",
    "--dyn-enable-structural-tag": "structural-tag guided decoding of tool calls is not "
                                   "implemented (the model card advertises it off)",
}
# flag -> (the value that keeps 1.6.1's default, why any other is refused)
REFUSED_VALUES = {
    "--kv-state-endpoint": (None, "KV events and KV state are owned by the serving endpoint"),
    "--dyn-default-thinking-mode": (None, "a deployment-wide thinking default is not "
                                          "implemented"),
    "--dyn-structural-tag-scope": (None, REFUSED_SWITCHES["--dyn-enable-structural-tag"]),
    "--dyn-structural-tag-schema": (None, REFUSED_SWITCHES["--dyn-enable-structural-tag"]),
    "--multimodal-embedding-cache-capacity-gb": ("0", NOT_TEXT_LLM),
    "--embedding-transfer-mode": ("nixl-write", NOT_TEXT_LLM),
    "--engine-request-limit": (None, "worker-side request admission is not implemented; SGLang's "
                                     "--max-running-requests and --max-queued-requests bound load"),
    "--engine-route": (None, "engine routes are not implemented (--debug-routes serves read-only "
                             "ones)"),
    "--sglang-trace-level": ("2", "SGLang tracing is not wired into this worker"),
}
# `--dyn-structural-tag` takes an optional value; `false` keeps structural tags off.
STRUCTURAL_TAG_OFF = ("false", "0", "no", "off")
# Implemented by the tool-call and reasoning parser work in this worker (issue 19), not here.
HANDLED_ELSEWHERE = ("--dyn-tool-call-parser", "--dyn-reasoning-parser")
