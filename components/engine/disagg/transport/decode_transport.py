"""DecodeTransport: the decode's KV transport. It registers each room's destination pages with
the room's prefill (one side-channel connection per prefill) and waits for the WRITE (the room
states: ``decode_side.py``; the contract: ``transport.py``)."""

from __future__ import annotations

import torch

from components.engine.disagg.transport.auth import sign_hello
from components.engine.disagg.transport.bootstrap_client import BootstrapClient
from components.engine.disagg.transport.decode_side import DecodeSide
from components.engine.disagg.transport.path_probe import probe_enabled
from components.engine.disagg.transport.peering import Peering
from components.engine.disagg.transport.peers import Throttle
from components.engine.disagg.transport.runs import Run
from components.engine.disagg.transport.transport import TransportBase, check_timeout
from protocol.kv_side_channel import Hello

__all__ = ["DecodeTransport"]


class DecodeTransport(TransportBase):
    role = "decode"

    def __init__(self, pool: torch.Tensor, transfer_timeout: float,
                 agent_name: str | None = None, peering: Peering | None = None) -> None:
        check_timeout("transfer_timeout", transfer_timeout)
        peering = peering or Peering()
        self._client: BootstrapClient | None = None
        super().__init__(pool, agent_name, peering)
        with self._closed_on_error():
            throttle = Throttle()
            hello = Hello(agent_name=self._nixl.name, agent_metadata=self._nixl.metadata,
                          pool_base=self._nixl.base, pool_bytes=self._nixl.nbytes,
                          layout=peering.layout, ucx_error_handling=peering.ucx_error_handling,
                          probe_base=self._nixl.probe_base)
            self._client = BootstrapClient(self._ctx, self._poller,
                                           lambda: sign_hello(peering.secret, hello), throttle)
            self._side = DecodeSide(self._nixl, self._client, float(transfer_timeout),
                                    self._events.append, peering.secret, throttle,
                                    probe=probe_enabled())

    def add_decode(self, room: int, bootstrap_host: str, bootstrap_port: int,
                   runs: list[Run], rid: str, skip: int = 0) -> None:
        self._require_open()
        self._side.add_decode(int(room), bootstrap_host, int(bootstrap_port), runs, rid,
                              int(skip))

    def abort_unregistered(self, room: int, bootstrap_host: str, bootstrap_port: int,
                           message: str = "Aborted") -> None:
        """The engine gave ``room`` up before ``add_decode``; the prefill stops it."""
        self._require_open()
        self._side.abort_unregistered(int(room), bootstrap_host, int(bootstrap_port), message)

    def _channel(self) -> BootstrapClient | None:
        return self._client
