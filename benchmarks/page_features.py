"""The docs page's prose for the benchmarks of engine features (n > 1, structured output,
logprobs, prefix cache, KV-aware routing); benchmarks/page_text.py has the serving path's."""

CHOICES = """\
`python -m benchmarks.bench_choices`: `n > 1` on the CPU engine (`small` model, one torch
thread, prefix cache off): one request with `n=8` (the 1,024-token prompt prefilled once and
forked into the choices) against 8 concurrent single requests with the same prompt and the
choices' seeds (seed + index), 16 new tokens each, seeded sampling; wall time from submission to
the last token. The tokens of the two arms must be identical.
"""

CHOICES_SGLANG = """\
`python -m benchmarks.bench_choices_sglang`: `n > 1` on a disaggregated `sglang.Engine` pair
(`--engine sglang`, Tokens mode, the frontend orchestrating) behind the real frontend, `small`
model: SGLang's PD decode cannot fork adopted KV, so each choice runs as its own request in room
`room + i` on both legs, the prompt warmed into the prefill's radix cache first, each choice's KV
in its own transfer. A 400-word prompt, one token per choice (temperature 0.7, `top_k` 1), n
alternated within each repetition; every answer must carry n choices. Run on its own, after the
`make bench` run the other sections come from. On `small` the second choice costs far more than
one token's work (the n=1 to n=2 step was 1.3 s in a 5-run check of the code before this run
too, so it is not the decode's wait for the prefill leg's end); on `tiny` the three values of n
were within 0.1 s of each other (10 runs). Not yet profiled.
"""

CONSTRAINED = """\
`python -m benchmarks.bench_constrained`: what structured output costs the CPU engine. A batch
of 16 rows (128-token prompts, 64 new tokens each, sampled) decodes once with every row under a
JSON schema (an array of at least 32 records, so no grammar ends inside the measurement) and
once without, arms alternated within each repetition after one warm-up. Steady-state decode
tok/s as in `bench_engine`; plus the wait of a request whose schema nobody compiled before. The
`small` model's vocabulary is 2,048 tokens: a 128k vocabulary makes each row's bitmask fill
longer (xgrammar's per-token cost grows with the tokens its cache cannot precompute).
"""

PREFIX_CACHE = """\
`benchmarks/bench_prefix_cache.py`: the CPU engine in process, `small` model, one request at a
time. Per prefix length: time to first token of a prompt whose prefix is new (the whole prompt is
prefilled), then of a prompt with the same prefix and a new 16-token suffix (the cached whole
pages are copied; only the rest is prefilled). Fresh prefixes each run.
"""

KV_ROUTING = """\
`benchmarks/bench_kv_routing.py`: two stacks started together, each the real `dynamo.frontend`
and two aggregated workers publishing KV events (`--kv-events-config`), `small` model; one runs
`--router-mode kv`, the other `--router-mode round-robin`. Each of 6 prefixes of 512 tokens is
sent 4 times with fresh 16-token suffixes in a shuffled order, each request to both stacks in
turn, one at a time. TTFT is the first streamed token at the client; "prompt tokens from cache"
sums the workers' `/engine/prefix_cache` hit counters.
"""

KV_ROUTING_DISAGG = """\
`benchmarks/bench_kv_routing.py` (`--arms disagg`): the same workload and method on the
disaggregated stack, frontend-orchestrated: each stack is the real `dynamo.frontend`, two prefill
workers publishing KV events and one decode worker (no prefix cache, publishes nothing), `small`
model, CPU engine. The router mode decides which prefill worker computes a prompt (the
frontend's prefill router); "prompt tokens from cache" sums the prefill workers' hit counters.
"""

LOGPROBS = """\
`python -m benchmarks.bench_logprobs`: what logprobs cost the CPU engine. A batch of 16 rows
(128-token prompts, 64 new tokens each) decodes with `top_logprobs_num` 5 on every row and
without, same prompts, arms alternated per repetition. The cost is each step's `log_softmax` +
`topk` for the rows that asked and the per-chunk tuples (components/engine/output/logprobs.py).
"""

MULTI_TURN = """\
`benchmarks/bench_multi_turn.py`: multi-turn chats that resend their whole history each turn
(an agent-like workload), `small` model, CPU engine, Tokens mode. Three stacks run side by side:
`disagg` (frontend, prefill and decode, frontend-orchestrated), `disagg-cache` (the same, its
decode started with `--disaggregation-decode-enable-radix-cache`) and `agg` (aggregated). Every
turn adds a 60-word user message to the last answer (32 tokens); 3 conversations of 6 turns go
one request at a time, the arms taking turns. "KV bytes" is the prefill's `kv_transfer_bytes`
counter's growth over the turn. "The last turn's share" is the share of `disagg`'s bytes that its
decode had already received or computed while it served the previous turn (the last prompt and
its answer): without a cache it receives them again; `disagg-cache`'s decode keeps them, and its
prefill sends only the rest.
"""

MULTI_TURN_SGLANG = """\
`benchmarks/bench_multi_turn.py --engine sglang`: the same conversations on `sglang.Engine`
(SGLang's CPU path), three disaggregated stacks side by side, frontend-orchestrated: this worker
without and with `--disaggregation-decode-enable-radix-cache` (SGLang's own decode radix cache),
and Dynamo 1.6.1's own SGLang worker (`python -m dynamo.sglang`) with the same flag. "KV bytes"
is SGLang's own `sglang:kv_transfer_total_mb` on the prefill (`--enable-metrics`) over the turn.
Six SGLang engines share 2 cores here, so TTFT is mostly the box's contention; the bytes are the
result. With one decode per stack both workers send the same bytes; what differs is routing with
several decodes (decode-orchestrated, this worker's decodes publish their cache's KV events and the
frontend's KV router picks the holder: `tests/e2e/test_e2e_decode_cache.py`).
"""
