"""The docs page's prose for the aiperf benchmark (benchmarks/bench_aiperf.py)."""

AIPERF = """\
`python -m benchmarks.bench_aiperf`: NVIDIA's own load generator, `aiperf profile` 0.13
(installed by `make bench` into `.venv-aiperf`, apart from the project's pins), against eight
arms, six of them `python -m dynamo.frontend` with its workers, `tiny` model, all started once and
measured in rotated order per repetition:

- **agg**, **disagg**: this worker on its CPU engine (aggregated; prefill + decode over NIXL);
- **agg-sglang**, **disagg-sglang**: this worker on the real `sglang.Engine` (`--engine sglang`,
  SGLang's CPU path with the test stand-ins);
- **dynamo-sglang**, **dynamo-sglang-disagg**: Dynamo 1.6.1's own `python -m dynamo.sglang`,
  aggregated, and a prefill and a decode worker (NIXL; the decode with
  `--disaggregation-decode-retraction-backup none`, which this worker sets itself on SGLang's CPU
  path), with the same engine flags (`--page-size 16 --max-total-tokens 8192 --context-length
  2048 --max-running-requests 8 --device cpu --attention-backend torch_native
  --disable-cuda-graph --dtype float32 --skip-tokenizer-init`): the references. A disaggregated
  arm's ratios are taken against dynamo-sglang-disagg, every other arm's against dynamo-sglang;
- **sglang-native**, **sglang-native-disagg**: SGLang's own serving, what a user without Dynamo
  runs: `python -m sglang.launch_server` with the same engine flags but `--skip-tokenizer-init`
  (SGLang's server tokenizes), behind the Shepherd Model Gateway (`smg launch`, smg 1.13.0,
  installed by `make bench` into `.venv-smg`): one server (`--worker-urls URL`), or a prefill and
  a decode server (NIXL; `--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`). The
  gateway stands where Dynamo's frontend stands in the other arms: its CPU is not counted as the
  workers'. At start-up each must answer one greedy request token for token as agg-sglang does
  (`benchmarks/native_arms.py`).

Load, all aiperf's: synthetic chat prompts of 256 tokens, 32 output tokens (`ignore_eos`),
streamed, concurrency 8, a warm-up of 8 requests, then the measured requests; token counts from
the server's `usage` (`--use-server-token-count`). Output tok/s, TTFT and ITL percentiles (aiperf's
ITL: a request's decode time over its tokens after the first) are read from aiperf's JSON export.
Worker CPU per output token: every process of the arm's workers (with SGLang's scheduler and
detokenizer processes) sampled from `/proc` every 100 ms, cut to aiperf's measured phase, over its
output tokens; *of it worker processes*: the worker processes alone (the Dynamo runtime, the
handlers and, on SGLang, its tokenizer manager), each also compared with the reference's process
of the same role. The goals compare agg-sglang with dynamo-sglang and disagg-sglang with
dynamo-sglang-disagg (the same engine). The size knob: `BENCH_AIPERF_REQUESTS` (measured
requests per run; `make bench` 64, `--quick` 16).

While one arm is measured, every other arm's SGLang scheduler and detokenizer processes are
stopped (SIGSTOP, then SIGCONT): idle, SGLang's disaggregated schedulers keep polling on its CPU
path (their event loop and NIXL's UCX threads; four of them took both cores of this machine), so
the arm measured would otherwise share the machine with the idle ones. The measured arm's own
are stopped too until aiperf reports its set-up done (its tokenizer and synthetic dataset), just
before the warm-up: polling, a disaggregated pair stretched that set-up from ~6 s to ~35 s. The
worker and frontend processes keep running, and with them the arms' discovery registrations.

Noise: the arms of a repetition run back to back, and the goals' bounds give each ratio's spread
over the repetitions. Before the other arms' engine processes were stopped during a run, their
polling decided the figures: one arm measured at 232 tok/s with them running served about 600
alone, and the CPU-engine disagg arm's responses arrived in bursts (ITL p50 0.4 ms; 5.4 ms in this
run). The disaggregated SGLang arms stay slow on this machine because of their own polling: an
idle SGLang prefill + decode pair took 1.97 of the 2 cores over 10 s (2026-12-03).
"""
