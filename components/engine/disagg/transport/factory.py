"""``KVTransport``: the transport one side of a disaggregated pair needs, by its role name (the
engine's ``--disaggregation-mode``). Each side is its own class; this only picks one."""

from __future__ import annotations

import torch

from components.engine.disagg.transport.decode_transport import DecodeTransport
from components.engine.disagg.transport.peering import Peering
from components.engine.disagg.transport.prefill_transport import PrefillTransport
from components.engine.disagg.transport.transport import check_host, check_timeout

__all__ = ["KVTransport", "ROLES"]

ROLES = ("prefill", "decode")


# Named as a class: callers construct "a KV transport" and need not know there are two classes.
def KVTransport(pool: torch.Tensor, role: str, host: str, bootstrap_port: int | None,
                bootstrap_timeout: float, transfer_timeout: float, agent_name: str | None = None,
                peering: Peering | None = None) -> PrefillTransport | DecodeTransport:
    """A ``PrefillTransport`` or a ``DecodeTransport``; ``host``, ``bootstrap_port`` and
    ``bootstrap_timeout`` concern the prefill's bootstrap server (a decode checks them only)."""
    if role not in ROLES:
        raise ValueError(f"KV transport role must be one of {ROLES}, got {role!r}")
    check_timeout("bootstrap_timeout", bootstrap_timeout)
    check_timeout("transfer_timeout", transfer_timeout)
    check_host(host)
    if role == "prefill":
        return PrefillTransport(pool, host, bootstrap_port, bootstrap_timeout, transfer_timeout,
                                agent_name, peering)
    return DecodeTransport(pool, transfer_timeout, agent_name, peering)
