"""The prose of docs/benchmarks.md; benchmarks/summary.py adds the generated tables and ratios."""

from benchmarks.page_aiperf import AIPERF
from benchmarks.page_features import (
    CHOICES, CHOICES_SGLANG, CONSTRAINED, KV_ROUTING, KV_ROUTING_DISAGG, LOGPROBS, MULTI_TURN,
    MULTI_TURN_SGLANG, PREFIX_CACHE,
)


INTRO = """\
# Benchmarks

Every figure on this page is a comparison measured in one run: each benchmark runs its baseline
alongside the thing measured, interleaving the arms, and reports the **median of at least 3 runs**.
The tables and ratio lines below are generated from the JSON in [`bench/`](bench/) by
`python -m benchmarks.summary --docs docs/benchmarks.md`; the plots are the PNGs the benchmarks
wrote.

**Machine.** 2 vCPUs, no GPU, shared by every process of a topology (frontend, workers, client).
Each engine runs one torch intra-op thread. Absolute numbers are tiny next to a GPU's; read the
ratios, which is what these benchmarks are for. The exact CPU, library versions and the load
average when the run started are listed at the end of the page.

**Model.** The project's `small` model (`python -m components.model_builder --size small`):
Llama architecture, hidden 512, 8 layers, 8 attention heads / 4 KV heads (head_dim 64),
intermediate 1536, vocabulary 2,048 (byte-level BPE), about 26M parameters, fp32, random weights
from seed 0. KV cache: 16 KiB per token.

**Commands.**

```bash
make bench                                  # = bash benchmarks/run_all.sh: everything, ~33 min
bash benchmarks/run_all.sh --quick          # smoke run (~6 min, 1 repetition, smaller sizes)
bash benchmarks/run_all.sh --publish        # full run, then copy PNG + JSON here (docs/bench/)
python -m benchmarks.summary --docs docs/benchmarks.md   # regenerate this page from docs/bench/
```

Results land in `results/` (git-ignored): one `<name>.json`, `<name>.png` and `<name>.log` per
benchmark, and `summary.md` with all tables. Each benchmark also runs on its own; its flags are
in `python -m benchmarks.<name> --help`.
"""

SERVING = """\
`python -m benchmarks.bench_serving` — a client in the style of `sglang.bench_serving` and
`vllm bench serve`, streaming OpenAI `/v1/chat/completions` over HTTP. Three arms, started once
and measured in interleaved, rotated order at each concurrency:

- **engine**: the same requests straight into an aggregated CPU engine in the benchmark process
  (SGLang's `Engine.async_generate`, token ids in): the baseline;
- **agg**: `python -m dynamo.frontend` + one aggregated worker (`python -m components`);
- **disagg**: the frontend + a decode worker + a prefill worker, KV cache moved with NIXL.

Workers run in Tokens mode (`--skip-tokenizer-init`: the frontend applies the chat template and
tokenizes), as Dynamo deploys SGLang. Workload: random prompts from a fixed seed, **128 to 1,024
tokens** (chat-templated length, sglang's `random` dataset style), **32 output tokens** forced with
`max_tokens` + `ignore_eos`, greedy; closed loop at **concurrency 1 and 16** (`make bench`; the
benchmark's default adds 4) with 2 requests per client (at least 4). `--request-rate R` adds an
open-loop (Poisson) run; `--text-mode` runs the workers in Text mode (they apply the template and
tokenize, off the event loop).
Definitions: TTFT = request sent to first token; ITL = every gap between token-carrying chunks;
TPOT = (E2E - TTFT) / (tokens - 1); throughput = tokens or requests over the run's wall time.
Tokens are counted from Dynamo's per-chunk `nvext.completion_token_ids` (requested with
`nvext.extra_fields`) and checked against `usage.completion_tokens` (`stream_options.include_usage`)
and `max_tokens`; prompt lengths are checked against `usage.prompt_tokens`.

How to read it: *tput / engine* is what the component and the frontend cost in throughput (HTTP,
SSE, the frontend's tokenization and detokenization, the request plane, the handler), *TTFT -
engine* the same in milliseconds. On 2 cores the frontend and the workers compete with the engine
for CPU, so this is an upper bound on the overhead. Disaggregation splits prefill and decode over
two processes, which on this machine means two cores: a long prefill no longer stalls the running
decode batch, so ITL p99 drops, while each request pays the KV hand-off.
"""

STREAM = """\
`python -m benchmarks.bench_stream_overhead` — a synthetic engine with SGLang's Engine API emits
N one-token chunks as fast as it can. Arms: iterate the engine directly (baseline), and
`handlers.decode.DecodeHandler.generate` in Tokens mode (token deltas) and Text mode (OpenAI chat
chunks with the usage chunk), for N = 1,000 and 16,000. If the handler does O(1) work per chunk,
its throughput ratio to the baseline and its cost per chunk do not change with N. The *marginal*
cost (slope between the two sizes) removes the per-request fixed cost (validation, the chat
template, the first chunk) that weighs on N = 1,000.
"""

PREPROCESS = """\
`python -m benchmarks.bench_preprocess_loop` — the worker's event loop while a **64k-token chat**
(system prompt + alternating ~1,200-token turns) is templated and tokenized with the model's fast
tokenizer (docs/reference/preprocessing.md).
Arms: **inline** on the loop (the naive baseline), **shared**
(`asyncio.to_thread` with the loop's own tokenizer: the naive fix, one Rust backend shared by two
threads) and **executor** (the project's `handlers.text.preprocess.Preprocessor`: one FIFO thread with
its own clone of the backend). Measured over the job's window, on the same loop: **loop lag**
(a task sleeping 1 ms; lag = actual interval - 1 ms), the **inter-token gap of a concurrent short
stream** (a thread delivers a token every 5 ms through `call_soon_threadsafe`, as the engine thread
does), and a **loop-side tokenizer call** every 5 ms (`tok(["a", "bb"], padding=True)`, the probe
SGLang used). For reference, SGLang measured a loop-side call waiting **~300 ms** behind a
250k-token encode with a shared backend, and **~0.3 ms** with a separate one
(in the change that moved its tokenization off the event loop).
"""

KV = """\
`python -m benchmarks.bench_kv_transfer` — the engine's KV transport (`KVTransport`, NIXL WRITE
over UCX between two processes, the decode side registered first) against a same-process
`torch` `copy_` of the same bytes with one thread, at the KV sizes of 128- to 4,096-token prompts
on the `small` model (16 KiB per token). Three arms, interleaved round by round, each with its
own pools, transport and decode process (`--arms LAYOUT:CMA_SEG_SIZE`): **head:512k**, the
engine's head-major pool (64 runs per request: layer, K/V, KV head) under UCX's default 512 KiB
`cma` segments (before); **head:1g**, the same pool as the engine now creates its UCX backend;
**token:1g**, a token-major pool, where a request's whole KV is one run, so one descriptor.
The NIXL time includes building descriptors, posting the WRITE and polling it to completion; the
data is verified on the decode side. "paired" is the median of each round's NIXL / copy_ (the
arms run back to back), steadier than the ratio of medians while other jobs load the machine.
The kernel arms time `process_vm_writev` (pointed at this process) of the same runs, in one call
and one call per run: on one host UCX moves a WRITE with exactly that call (its `cma` transport;
tcp carries only the notification). Both pools sit on transparent huge pages, as the engine's do.

Where a WRITE's time goes (`strace` of the prefill, timers around each call): UCX makes one
`process_vm_writev` per **512 KiB segment** of each descriptor (`UCX_CMA_SEG_SIZE`; 16 calls for
an 8 MiB descriptor, 64 for a 64-run room). The engine now creates the backend with
`CMA_SEG_SIZE=1g` (NIXL's `engine_config`): one call per descriptor, which moves the
head-major pool only where its runs exceed 512 KiB (64 MiB: 0.4-0.7 ms less per WRITE); with a
token-major pool one call per WRITE (strace: one 8 MiB call), 0.5-0.7 ms less at 8 MiB (1.15-1.57
against 1.83-2.10 ms, three runs). Neither reaches 0.9x `copy_`, for two reasons measured in the
same rounds: the kernel copy itself, one call, runs at 0.66-0.89x `copy_` at 8 MiB (it pins the
destination's pages and copies across address spaces), and a one-descriptor WRITE spends
0.23-0.36 ms more than that call (NIXL's descriptor lists and transfer handle 0.1 ms, the side
channel's `Written` wake-up 0.1-0.2 ms, the engine's run checks, pairing, notification and
completion poll), when 0.9x at 8 MiB (`copy_` 0.8-0.9 ms) leaves at most 0.1 ms beyond a copy
as fast as `copy_`. The head-major pool stays the engine's: its token-major twin slows decode
attention 1.2-1.4x (`python -m benchmarks.bench_kv_layout_attention`, the engine's attention
function, interleaved: batch 1 at 2,000 tokens of context 1.43x, batch 16 at 128 tokens 1.16x,
at 1,024 tokens 1.20x), paid every decode step, against 0.5-0.7 ms once per request. Neither
`NIXL_UCX_SGL_ENABLE=1` (one scatter-gather put) nor a decode that polls without pause moved
the WRITE. What did matter is NIXL's UCX error
handling: under its default (`peer`) a WRITE's flush completes only after the *decode* has
progressed UCX (a decode that never polls leaves the WRITE unfinished for good), and NIXL sends
the notification only after the flush. The engine runs `ucx_error_handling_mode=none`
(`--cpu-kv-ucx-error-handling`, the same on both sides): data, flush and notification complete
inside the posting call, and the first WRITE to a peer fell from 13.7-14.7 ms to 0.7-0.8 ms
(`--ucx-error-handling peer` vs `none`, two back-to-back pairs of runs).

Spread over three runs (2026-12-03, `python -m benchmarks.bench_kv_transfer --runs 7`, load
average 1.1-1.9 at start while other jobs shared the machine; the table below is the third),
paired NIXL / copy_ at 8, 16, 32, 64 MiB: head:512k 0.46-0.60, 0.55-0.61, 0.60-0.73, 0.66-0.70;
head:1g 0.44-0.48, 0.56-0.60, 0.64-0.72, 0.70-0.87; token:1g 0.48-0.62, 0.50-0.66, 0.68-0.84,
0.72-0.75. The same head:512k arm gave 0.72x at 8 MiB on 2026-12-01 on a quieter machine.
"""

TTFT = """\
`python -m benchmarks.bench_disagg_ttft` — engine level, one request at a time: an aggregated
engine (baseline) against a prefill engine in another process plus a decode engine in this one,
which meet through the prefill's bootstrap server and move the KV with NIXL exactly as the
workers do. The disaggregated TTFT is split with the engines' own timing records
(`harness/engine_timing.py`): **compute** = the prefill forward; **transfer** = end of that
forward to KV WRITE complete (decode registered its pages during the forward); **hand-off** =
everything else (dispatch to the prefill engine, the completion notification, decode adopting the
request and emitting its first token). The aggregated TTFT is split into the same compute and the
rest. Greedy tokens of both paths are compared.

After the WRITE (26 requests, median): decode used to see the notification only at the end of its
1 ms poll slice (0.65-0.78 ms after the WRITE was done), then took ~1.2 ms to deliver the first
token: 1.8-2.0 ms in all. The prefill now sends `Written` on the side channel once the WRITE is
done, which wakes that poll: notification seen 0.31 ms after, first token 0.98 ms after. What
is left is the decode engine thread handing the first token to the event loop (0.6-1.2 ms).
"""

SERVING_TINY = """\
The same benchmark on the `tiny` model (hidden 64, 2 layers: a forward pass costs well under a
millisecond), with an open-loop run added. Compute almost vanishes, so what is left is the cost
per request and per token of the serving path itself: HTTP and SSE, the frontend's tokenization
and detokenization, the request plane, the handler (and, disaggregated, the second hop and the KV
hand-off), against the same engine called in-process. Both ways to disaggregate are measured
(docs/reference/orchestration.md): **disagg** is Dynamo 1.6.1's own orchestration
(the frontend sends each request to a prefill worker, then to a decode worker with the prefill's
bootstrap answer), **disagg-decode** the decode worker calling its prefill worker itself.
"""

TOKEN_CPU = """\
`python -m benchmarks.bench_token_cpu`: where each output token's CPU goes. 16 closed-loop
streams of short prompts on the `tiny` model through the real frontend, while the CPU time of
every thread of every process is read from `/proc/<pid>/task/<tid>/schedstat` before and after
the load; each figure is CPU microseconds per output token. A worker's threads are split into
its event loop (the main thread), the engine thread (`cpu-engine`) and the rest (Dynamo's Rust
runtime: request plane and the Rust <-> Python bridge); `client` is the benchmark's own process
(the HTTP client; for `engine` also the engine). Dynamo's Rust `dynamo.mocker` behind the same
frontend is the reference for the frontend's share and for what a native worker costs per token;
`floor` is a Python worker that only streams (`benchmarks/floor_worker.py`: one token per stream
per 3.5 ms step, no engine, no handler), what Dynamo's Python bindings alone cost per token. The
mocker (`--speedup-ratio 1.4`) and the floor are paced near the aggregated worker's token rate.
`agg-interval2` is the aggregated worker with SGLang's `--stream-interval 2` (a chunk every two
tokens, the first at once): the knob an operator trades chunk size for CPU with.
What bounds the worker's tok/s: its Python threads (engine thread, event loop, the runtime's calls
into Python) share one GIL, so its CPU per token in all threads caps its rate (the line below the
table), and the engine thread's own share, which the in-process engine pays too, is the larger
part; every process of the stack also shares the 2 cores.
"""

ENGINE = """\
`python -m benchmarks.bench_engine` (context for the absolute numbers above): the CPU engine alone
on the `small` model with one torch thread: prefill tokens/s by prompt length, decode tokens/s at
batch 1 and 16, and the lag of the embedding process's asyncio loop while a 2,000-token prefill
runs on the engine thread.
"""

VS_TRANSFORMERS = """\
`python -m benchmarks.bench_vs_transformers`: the CPU engine against transformers' own continuous
batching (`model.generate_batch`, stock `sdpa` attention) on the same `small` model, the same
torch thread count and the same prompts (a batch of 16 prompts of 128 tokens, 32 new tokens each,
greedy, `ignore_eos`), both given the whole batch at once; wall time from submission to the last
token, prefill included. The arms alternate within each repetition after one warm-up each.
"""

TOKENIZER_WORKERS = """\
`python -m benchmarks.bench_tokenizer_workers`: `--tokenizer-worker-num 1` against `2` on the
`tiny` model in Text mode (the workers template, tokenize and detokenize), each behind its own
frontend, arms interleaved. Throughput: 16 concurrent chat streams (128-512-token prompts, 64
output tokens). Stall: four short streams keep flowing while one 64k-token chat is templated and
tokenized (then refused as longer than the context); the largest and p99 gap between their tokens
over that window, and each worker process's own event-loop lag over it, read from its `/metrics`
histogram (`dynamo_component_engine_event_loop_lag_seconds`, sampled every 50-150 ms while streams run; the figure is the
smallest bucket holding every wake-up). "Idle loop lag" is a process that runs nothing but the
same sampler on an asyncio loop (`benchmarks/lag_probe.py`), measured over the same window: what
the loaded machine gives any event loop. "Streams only" is the workers' largest lag over 0.3 s
with the four short streams alone, just before the long chat: the reference for what tokenizing
adds.
"""

IDLE_CPU = """\
`python -m benchmarks.bench_idle_cpu`: each worker registered behind its own frontend, probed
with one request, then left alone; the CPU its own process (event loop, Dynamo's runtime
threads, the CPU engine's thread) and its whole process tree use, in cores, over `--window`
seconds (12 in `make bench`; the run's own is `window_s` in `idle_cpu.json`).
`sglang` and `dynamo-sglang` have SGLang's scheduler and detokenizer processes as children (on
SGLang's CPU path its scheduler polls while idle); `floor` is the Python worker that only streams
(its shared step clock keeps ticking while idle). The worker samples its loop lag only while
requests are in flight (`components/worker/metrics/loop_lag.py`).
"""

SECTIONS = [
    ("serving", "Serving: engine in-process vs Dynamo aggregated vs disaggregated", SERVING),
    ("serving_tiny", "Serving overhead with a near-zero-cost model (tiny)", SERVING_TINY),
    ("token_cpu", "CPU per output token, by process and thread", TOKEN_CPU),
    ("idle_cpu", "What an idle worker costs", IDLE_CPU),
    ("bench_aiperf", "aiperf: this worker vs Dynamo 1.6.1's dynamo.sglang", AIPERF),
    ("stream_overhead", "Streaming overhead of the decode handler", STREAM),
    ("preprocess_loop", "Event-loop responsiveness during framework tokenization", PREPROCESS),
    ("tokenizer_workers", "Tokenizer worker processes (`--tokenizer-worker-num`)",
     TOKENIZER_WORKERS),
    ("bench_kv_transfer", "KV transfer bandwidth: NIXL vs a same-process copy", KV),
    ("disagg_ttft", "TTFT: aggregated vs disaggregated, split", TTFT),
    ("bench_engine", "CPU engine throughput", ENGINE),
    ("vs_transformers", "CPU engine vs transformers' continuous batching", VS_TRANSFORMERS),
    ("bench_choices", "n > 1: one prefill forked vs n single requests", CHOICES),
    ("bench_choices_sglang", "n > 1 on a disaggregated sglang.Engine: the cost of each choice",
     CHOICES_SGLANG),
    ("bench_constrained", "Structured output: decode under a JSON schema", CONSTRAINED),
    ("bench_logprobs", "Logprobs: decode with top-5 logprobs vs without", LOGPROBS),
    ("bench_prefix_cache", "Prefix cache: a repeated long prefix against its first prefill",
     PREFIX_CACHE),
    ("multi_turn", "Multi-turn chats, disaggregated: the KV each turn sends, with and without "
     "the decode's cache", MULTI_TURN),
    ("multi_turn_sglang", "Multi-turn chats on sglang.Engine: this worker and Dynamo 1.6.1's, "
     "with SGLang's decode cache", MULTI_TURN_SGLANG),
    ("bench_kv_routing", "KV-aware routing vs round-robin (TTFT)", KV_ROUTING),
    ("bench_kv_routing_disagg", "KV-aware routing vs round-robin, disaggregated: which prefill "
     "worker (TTFT)", KV_ROUTING_DISAGG),
]

FOOTER = """\
## Caveats

- Two cores host every process of a topology and the load generator, so arms that use more
  processes (disaggregated) also buy more CPU; on a GPU box the balance differs. Dynamo's own
  guidance applies: with small models disaggregation "will often look slower than aggregated"
  and is for plumbing validation (Dynamo, `docs/backends/sglang/README.md`).
- ITL is measured where a user sees it, at the client. When 2 cores are busy, the client reads
  several queued SSE events at once, so some gaps shrink to microseconds and the next one grows:
  ITL p50 can look better than the engine's step time while p99 gets worse. TPOT (per request)
  is the steadier per-token figure.
- The engine arm runs in the benchmark's own process (its client shares that process), while the
  HTTP arms run their engines in worker processes: the baseline is what an embedded engine gives,
  not a lower bound on hardware.
- The model's weights are random: outputs are not language, only their lengths matter (fixed by
  `ignore_eos`), and the frontend's detokenizer sees many partial UTF-8 sequences.
- Noise: repeat `make bench` on an idle machine; run-to-run spread of a few percent (Dynamo
  reports 3-6% for its own A/B runs) is within noise.
"""
