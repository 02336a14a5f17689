"""The paged KV pool (`pool.py`, its memory from `host_memory.py`), the prefix cache
(`prefix_cache.py`) and the listener it reports cached blocks and load to (`events.py`). The
bottom of the engine's stack, beside `model/` and `output/` (test_layout.py)."""
