"""The CPU engine against transformers' own continuous batching (`model.generate_batch`):
same model, same torch thread count, same prompts, greedy, in one run.

    .venv/bin/python -m benchmarks.bench_vs_transformers [--runs 3] [--batch 16]

Both arms get the whole batch at once (prompts of --prompt-len tokens, --new-tokens each with
`ignore_eos`), and the wall time from submission to the last token is measured, prefill
included. The arms alternate within each repetition; each is warmed up once first. Whether the
greedy tokens of the two arms agree is reported, not asserted (different attention kernels).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time

from benchmarks.common import (
    engine_bench_parser, format_table, limit_cpu_threads, median, new_figure,
    parse_engine_bench_args, ratio, results_dir, save_figure, write_json,
)

ARMS = ("engine", "transformers")


def make_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


class EngineArm:
    def __init__(self, model: str, threads: int) -> None:
        from components.engine.process.engine import CpuEngine

        self.engine = CpuEngine(model_path=model, num_threads=threads)
        self.vocab = self.engine.vocab_size

    def run(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}

        async def all_of() -> list[dict]:
            return await asyncio.gather(*(
                self.engine.async_generate(input_ids=p, sampling_params=params) for p in prompts))

        return [out["output_ids"] for out in asyncio.run(all_of())]

    def close(self) -> None:
        self.engine.shutdown()


class TransformersArm:
    def __init__(self, model: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=torch.float32, attn_implementation="sdpa").eval()

    def run(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        from transformers import GenerationConfig

        cfg = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                               pad_token_id=0)
        out = self.model.generate_batch(prompts, generation_config=cfg, progress_bar=False)
        # generate_batch keys results by request id in submission order ("req_0", ...).
        ordered = sorted(out.values(), key=lambda r: int(str(r.request_id).rsplit("_", 1)[-1]))
        return [list(r.generated_tokens) for r in ordered]

    def close(self) -> None:
        pass


def measure(args: argparse.Namespace) -> dict:
    limit_cpu_threads(args.threads)
    arms = {"engine": EngineArm(args.model, args.threads), "transformers": TransformersArm(args.model)}
    vocab = arms["engine"].vocab
    try:
        warm = make_prompts(2, 16, vocab, seed=999)
        for arm in arms.values():
            arm.run(warm, 4)
        tok_s = {name: [] for name in ARMS}
        agree = []
        for r in range(args.runs):
            prompts = make_prompts(args.batch, args.prompt_len, vocab, seed=r)
            outs = {}
            for name in (ARMS if r % 2 == 0 else ARMS[::-1]):
                t0 = time.perf_counter()
                outs[name] = arms[name].run(prompts, args.new_tokens)
                tok_s[name].append(sum(map(len, outs[name])) / (time.perf_counter() - t0))
            agree.append(outs["engine"] == outs["transformers"])
    finally:
        for arm in arms.values():
            arm.close()
    med = {name: median(v) for name, v in tok_s.items()}
    return {"tok_s": med, "runs_tok_s": tok_s, "tokens_identical": all(agree),
            "ratio": ratio(med["engine"], med["transformers"])}


def plot(res: dict, out) -> None:
    fig, (ax,) = new_figure(ncols=1, width=4.5)
    ax.bar(list(res["tok_s"]), list(res["tok_s"].values()))
    ax.set(title=f"batch {res['config']['batch']}: output tok/s", ylabel="tok/s")
    save_figure(fig, out, "vs_transformers")


def main() -> None:
    p = engine_bench_parser(__doc__, runs=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    args = parse_engine_bench_args(p)
    logging.basicConfig(level=logging.WARNING)
    res = measure(args)
    res["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    rows = [[name, res["tok_s"][name]] for name in ARMS]
    print(f"batch {args.batch} x {args.prompt_len}-token prompts, {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), median of {args.runs} runs")
    print(format_table(["arm", "output tok/s"], rows))
    print(f"engine / transformers continuous batching: {res['ratio']:.2f}x tok/s; greedy tokens "
          f"identical: {'yes' if res['tokens_identical'] else 'no'}")
    out = results_dir(args.out)
    path = write_json(out, "vs_transformers", res)
    plot(res, out)
    print(f"wrote {path} and {out}/vs_transformers.png")


if __name__ == "__main__":
    main()
