"""Multi-turn chats, disaggregated and aggregated: what each turn costs when the history is resent.

    .venv/bin/python -m benchmarks.bench_multi_turn [--engine cpu|sglang] [--conversations 3]
        [--turns 6] [--turn-words 60] [--output-len 32] [--model-path .cache/models/small-seed0]

An agent-like workload: each conversation opens with a user message of --turn-words words; every
turn appends the assistant's answer and a new user message and resends the whole history, as
chat clients and agents do. Three topologies run side by side in one run, Tokens mode on the CPU
engine: `disagg` (frontend, prefill and decode; frontend-orchestrated, the style Dynamo deploys),
`disagg-cache` (the same, its decode with `--disaggregation-decode-enable-radix-cache`) and `agg`
(one aggregated worker). `--engine sglang` runs `disagg` and `disagg-cache` on `sglang.Engine`
and, as the peer, Dynamo 1.6.1's own SGLang worker with the decode flag
(benchmarks/multi_turn_arms.py). The conversations go one request at a time, the arms taking
turns, so each turn's KV bytes are its prefill's counter's growth over that request, and no
arm's load disturbs another.

Per turn: the prompt's tokens (the frontend's usage), the time to the first token of each arm,
and the KV bytes each prefill wrote to its decode. Without the cache every turn ships the KV of
its whole prompt, its history included; with it, the history the decode kept stays there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import time
from pathlib import Path

import httpx

from benchmarks.common import format_table, median, percentile, results_dir, write_json
from benchmarks.multi_turn_arms import ARMS, REFERENCE, disagg_arms, spawn
from harness.decode_cache import kv_bytes
from harness.topology import Stack

READY_S = 300.0  # several SGLang workers starting at once on 2 cores
CORPUS = Path(__file__).resolve().parent.parent / "components" / "model_builder" / "corpus.txt"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=sorted(ARMS), default="cpu")
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--turn-words", type=int, default=60, help="words per user message")
    p.add_argument("--output-len", type=int, default=32, help="tokens per answer")
    p.add_argument("--model-path", default=".cache/models/small-seed0")
    p.add_argument("--out", default=None, help="results directory")
    return p.parse_args()


def user_messages(args: argparse.Namespace) -> list[list[str]]:
    """Per conversation, its user messages: random words from the model's own corpus."""
    words = CORPUS.read_text().split()
    rng = random.Random(0)
    return [[" ".join(rng.choice(words) for _ in range(args.turn_words))
             for _ in range(args.turns)] for _ in range(args.conversations)]


async def chat_turn(http: httpx.AsyncClient, stack: Stack, model: str, history: list[dict],
                    output_len: int) -> dict:
    """One streamed turn: its TTFT (ms), the answer's text and the usage the frontend counted."""
    body = {"model": model, "messages": history, "max_tokens": output_len, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    start, first, text, usage = time.perf_counter(), None, [], {}
    async with http.stream("POST", f"{stack.url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            for choice in event.get("choices") or ():
                if first is None:
                    first = time.perf_counter()
                text.append((choice.get("delta") or {}).get("content") or "")
            usage = event.get("usage") or usage
    end = time.perf_counter()
    return {"ttft_ms": ((first or end) - start) * 1e3, "e2e_ms": (end - start) * 1e3,
            "text": "".join(text),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens")}


async def run(args: argparse.Namespace, stacks: dict[str, Stack], model: str) -> list[dict]:
    """Every turn of every conversation on each arm, one request at a time."""
    arms, measured = ARMS[args.engine], disagg_arms(args.engine)
    rows = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as http:
        for conv, messages in enumerate(user_messages(args)):
            history = {arm: [] for arm in arms}
            held = 0  # tokens of the last turn's prompt and answer: KV the decode computed or got
            for turn, message in enumerate(messages):
                row = {"conversation": conv, "turn": turn, "decode_held_tokens": held}
                for arm in arms:
                    history[arm].append({"role": "user", "content": message})
                    before = kv_bytes(stacks[arm], args.engine, "prefill") if arm in measured else 0.0
                    got = await chat_turn(http, stacks[arm], model, history[arm],
                                          args.output_len)
                    history[arm].append({"role": "assistant", "content": got["text"]})
                    row[f"{arm}_ttft_ms"] = got["ttft_ms"]
                    row[f"{arm}_e2e_ms"] = got["e2e_ms"]
                    row[f"{arm}_output_tokens"] = got["completion_tokens"]
                    if arm in measured:
                        row[f"{arm}_kv_bytes"] = kv_bytes(stacks[arm], args.engine, "prefill") - before
                    if arm == REFERENCE:  # the prompt, answer and what the decode held
                        row["prompt_tokens"] = got["prompt_tokens"]
                        held = got["prompt_tokens"] + got["completion_tokens"]
                rows.append(row)
    return rows


def held_share(row: dict) -> float:
    """The share of a turn's KV transfer that the decode already held: the last turn's prompt
    and answer, which it received or computed itself (bytes per token are the same for all)."""
    return min(1.0, row["decode_held_tokens"] / row["prompt_tokens"])


def tables(rows: list[dict], turns: int, engine: str = "cpu") -> dict[str, dict]:
    """Per turn (medians over the conversations), and per arm over every turn."""
    arms, measured = ARMS[engine], disagg_arms(engine)
    by_turn = [[r for r in rows if r["turn"] == t] for t in range(turns)]
    per_turn = [[t + 1, median(r["prompt_tokens"] for r in rs),
                 *(median(r[f"{arm}_ttft_ms"] for r in rs) for arm in arms),
                 *(median(r[f"{arm}_kv_bytes"] for r in rs) for arm in measured),
                 median(held_share(r) for r in rs)]
                for t, rs in enumerate(by_turn)]
    per_arm = [[arm, percentile([r[f"{arm}_ttft_ms"] for r in rows], 50),
                percentile([r[f"{arm}_ttft_ms"] for r in rows], 99), throughput(rows, arm)]
               for arm in arms]
    return {"table": {"headers": ["turn", "prompt tokens",
                                  *(f"TTFT {arm} ms" for arm in arms),
                                  *(f"KV bytes {arm}" for arm in measured),
                                  "the last turn's share"],
                      "rows": per_turn},
            "arms_table": {"headers": ["arm", "TTFT p50 ms", "TTFT p99 ms", "output tok/s"],
                           "rows": per_arm}}


def throughput(rows: list[dict], arm: str) -> float:
    """Output tokens per second of the arm's requests, end to end (one request at a time)."""
    seconds = sum(r[f"{arm}_e2e_ms"] for r in rows) / 1e3
    return sum(r[f"{arm}_output_tokens"] for r in rows) / seconds if seconds else 0.0


def main() -> None:
    args = parse_args()
    model = Path(args.model_path).name
    stacks: dict[str, Stack] = {}
    try:
        for arm in ARMS[args.engine]:
            stacks[arm] = spawn(args.engine, arm, args.model_path, model)
        for stack in stacks.values():
            stack.wait_ready(model, timeout=READY_S, probe=True)
        rows = asyncio.run(run(args, stacks, model))
    except BaseException:
        print("\n".join(f"logs: {stack.workdir}" for stack in stacks.values()))
        raise
    finally:
        for stack in stacks.values():
            stack.stop()
    for stack in stacks.values():
        shutil.rmtree(stack.workdir, ignore_errors=True)
    out = tables(rows, args.turns, args.engine)
    for table in out.values():
        print(format_table(table["headers"], table["rows"]) + "\n")
    name = "multi_turn" if args.engine == "cpu" else f"multi_turn_{args.engine}"
    path = write_json(results_dir(args.out), name,
                      {"args": vars(args), **out, "turns": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
