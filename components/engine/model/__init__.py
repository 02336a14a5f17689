"""Attention on the KV pool (`attention.py`) and what the engine reads from the model directory
(`facts.py`). The bottom of the engine's stack, beside `kv/` (which it imports) and `output/`."""
