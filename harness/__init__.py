"""Engines and KV transport peers in child processes, for the tests and benchmarks (not shipped)."""
