"""Fixtures for the worker's unit tests."""

import pytest

from components.backends import select as backend_select


@pytest.fixture
def cpu_machine(monkeypatch):
    """Parse flags as on a machine without CUDA, whatever this one has, with no ENGINE set."""
    monkeypatch.setattr(backend_select, "cuda_available", lambda: False)
    monkeypatch.delenv("ENGINE", raising=False)
