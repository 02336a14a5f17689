"""A prefill side and a decode side (harness/transport_side.py) with 5 s timeouts, closed after
the test; modules that need other timeouts or pools define their own `pair`."""

import pytest

from harness.transport_side import TransportSide


@pytest.fixture
def pair():
    pre = TransportSide("prefill", bootstrap_timeout=5.0, transfer_timeout=5.0)
    dec = TransportSide("decode", bootstrap_timeout=5.0, transfer_timeout=5.0)
    yield pre, dec
    pre.close()
    dec.close()
