"""Random-length chat prompts from a fixed seed, in the style of sglang.bench_serving's `random`
dataset: sample token ids, decode them to text, send the text as one user message.

Each prompt also keeps the ids of its chat-templated form (what the frontend sends a Tokens-mode
worker), so the in-process engine arm runs the very same token sequence; the serving arm checks
`usage.prompt_tokens` against their count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    num_prompts: int
    input_min: int = 128
    input_max: int = 1024
    output_len: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.input_min <= self.input_max:
            raise ValueError(
                f"need 1 <= input_min <= input_max, got {self.input_min}..{self.input_max}"
            )
        if self.num_prompts < 1 or self.output_len < 1:
            raise ValueError("num_prompts and output_len must be >= 1")


@dataclass(frozen=True)
class Prompt:
    text: str
    input_ids: tuple[int, ...]  # chat template applied, generation prompt added

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)


def _ordinary_ids(tokenizer) -> list[int]:
    """Ids that decode to whole, printable characters: byte fragments would decode to U+FFFD,
    which re-encodes to several tokens and inflates prompt lengths."""
    special = set(tokenizer.all_special_ids)
    out = []
    for i in range(len(tokenizer)):
        piece = tokenizer.decode([i])
        if i not in special and piece and "\ufffd" not in piece and piece.isprintable():
            out.append(i)
    return out


def make_prompts(tokenizer, workload: Workload) -> list[Prompt]:
    """Prompts whose templated length is close to a uniform draw in [input_min, input_max]
    (decode-then-encode merges a few tokens, as in sglang's random dataset; lengths are
    reported)."""
    rng = random.Random(workload.seed)
    vocab = _ordinary_ids(tokenizer)
    prompts = []
    for _ in range(workload.num_prompts):
        target = rng.randint(workload.input_min, workload.input_max)
        text = tokenizer.decode([rng.choice(vocab) for _ in range(target)])
        # Re-encoding merges neighbours differently; cut to the target so lengths stay in range.
        text = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:target])
        messages = [{"role": "user", "content": text}]
        templated = tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True
        )
        if hasattr(templated, "keys"):
            templated = templated["input_ids"]  # transformers 5 returns a BatchEncoding
        prompts.append(Prompt(text=text, input_ids=tuple(int(t) for t in templated)))
    return prompts


def length_summary(prompts: list[Prompt]) -> dict[str, float]:
    lengths = [p.prompt_len for p in prompts]
    return {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths)}
