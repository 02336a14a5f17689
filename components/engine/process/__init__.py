"""The engines a caller holds: `CpuEngine` (`engine.py`, serving tokenizer workers when asked),
a tokenizer worker's `AttachedCpuEngine` (`attached.py`), and a separate engine process with the
worker's `RemoteCpuEngine` (`serve.py`, `remote.py`). The top of the engine's stack."""
