"""PrefillTransport: the prefill's KV transport. It binds the bootstrap server, meets the decodes'
registrations and WRITEs each room's KV into the decode that registered it (the rules:
``prefill_side.py``; the WRITEs: ``prefill_writes.py``; the contract: ``transport.py``)."""

from __future__ import annotations

import ipaddress
import logging

import torch
import zmq

from components.engine.disagg.transport.bootstrap import BootstrapServer
from components.engine.disagg.transport.peering import Peering
from components.engine.disagg.transport.peers import Throttle
from components.engine.disagg.transport.prefill_side import PrefillSide
from components.engine.disagg.transport.prefill_writes import TransferTotals
from components.engine.disagg.transport.runs import Run
from components.engine.disagg.transport.transport import (
    TransportBase,
    check_host,
    check_timeout,
)
from protocol.kv_side_channel import ChoiceFirst, FirstLogprob

__all__ = ["PrefillTransport"]

logger = logging.getLogger(__name__)


class PrefillTransport(TransportBase):
    role = "prefill"

    def __init__(self, pool: torch.Tensor, host: str, bootstrap_port: int | None,
                 bootstrap_timeout: float, transfer_timeout: float,
                 agent_name: str | None = None, peering: Peering | None = None) -> None:
        check_timeout("bootstrap_timeout", bootstrap_timeout)
        check_timeout("transfer_timeout", transfer_timeout)
        check_host(host)
        peering = peering or Peering()
        self._server: BootstrapServer | None = None
        super().__init__(pool, agent_name, peering)
        with self._closed_on_error():
            throttle = Throttle()
            self._server = BootstrapServer(self._ctx, host, bootstrap_port, throttle)
            self._poller.register(self._server.socket, zmq.POLLIN)
            self._poller.register(self._server.monitor, zmq.POLLIN)
            self._side = PrefillSide(self._nixl, self._server, float(bootstrap_timeout),
                                     float(transfer_timeout), self._events.append,
                                     peering.layout, peering.secret, throttle)
            _warn_if_exposed(host, peering)

    @property
    def bootstrap_port(self) -> int | None:
        return self._server.port if self._server is not None else None

    @property
    def bootstrap_connections(self) -> int:
        """Side-channel connections the bootstrap server holds open now."""
        return self._server.connections if self._server is not None else 0

    @property
    def counters(self) -> dict[str, int]:
        """Sizes of the tables peers can grow (all capped)."""
        return dict(self._side.counters)

    @property
    def transfer_totals(self) -> TransferTotals:
        """Completed WRITEs (count, bytes, seconds; ``prefill_writes.TransferTotals``)."""
        return self._side.totals

    def add_prefill(self, room: int, runs: list[Run], first_token: int, rid: str,
                    logprob: FirstLogprob | None = None, cached_tokens: int = 0,
                    choices: tuple[ChoiceFirst, ...] = (), tokens: int = 0) -> None:
        self._require_open()
        # Read pending messages first: a decode abort that already arrived must win over a WRITE.
        self._service(0.0)
        self._side.add_prefill(int(room), runs, int(first_token), rid, logprob, cached_tokens,
                               tuple(choices), int(tokens))

    def _channel(self) -> BootstrapServer | None:
        return self._server


def _warn_if_exposed(host: str, peering: Peering) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not peering.secret:
        logger.warning("KV bootstrap server listens on %s without a side-channel secret: any "
                       "host that reaches it can register as a decode peer", host)
