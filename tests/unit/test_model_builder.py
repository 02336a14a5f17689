import hashlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from components.model_builder import build_model_dir

PROMPTS = ["The quick brown fox", "def main():", "Return the number of items"]


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_loads_with_transformers_and_has_chat_template(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert tok.is_fast
    assert model.config.model_type == "llama"
    assert model.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), 0]
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>system\ns<|im_end|>" in text
    # byte-level BPE: any text round-trips, multi-byte characters included
    sample = "Café 日本語 🙂 naïve"
    assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_varies(tiny_model_path, prompt):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
        eos_token_id=None,
    )
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) == 32
    assert len(set(new)) >= 8, new


def test_same_seed_same_files_other_seed_other_weights(tmp_path, tiny_model_path):
    again = build_model_dir(tmp_path / "again", "tiny", seed=0)
    assert _digests(again) == _digests(Path(tiny_model_path))
    other = build_model_dir(tmp_path / "other", "tiny", seed=1)
    assert _digests(other)["model.safetensors"] != _digests(again)["model.safetensors"]
    assert _digests(other)["tokenizer.json"] == _digests(again)["tokenizer.json"]


def test_unknown_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        build_model_dir(tmp_path, "huge")


def test_qwen3_template_renders_tools_and_thinking_and_plain_chats_as_chatml(tmp_path):
    from components.model_builder.templates import CHAT_TEMPLATE, QWEN3_TEMPLATE

    tok = AutoTokenizer.from_pretrained(build_model_dir(tmp_path / "q", "tiny", 0, "qwen3"))
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    plain = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert plain == tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                            chat_template=CHAT_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    history = chat + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"}]
    text = tok.apply_chat_template(history, tools=tools, tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    assert '<tools>\n{"type": "function", "function": {"name": "f"' in text
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text
    assert "<tool_response>\n42\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Qwen3's markers are one token each, as in its own tokenizer.
    for marker in ("<tool_call>", "</tool_call>", "<think>", "</think>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    assert tok.chat_template == QWEN3_TEMPLATE
