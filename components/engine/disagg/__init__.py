"""Prefill/decode disaggregation on the engine thread: the coordinator (`coordinator.py`), what a
client sees when a transfer fails (`failures.py`) and the KV transport (`transport/`). Above
`core/`, below `api/`."""
