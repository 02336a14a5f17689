"""Per-token output work: sampling and its parameters (`sampling.py`, `sampling_params.py`),
incremental detokenization and stop strings (`detokenizer.py`), logprobs (`logprobs.py`) and
grammars (`grammar.py`). The bottom of the engine's stack, beside `kv/` and `model/`."""
