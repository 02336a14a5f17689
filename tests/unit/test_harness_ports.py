"""The test harness's port picker: a port it handed out is never handed out again, although
nothing binds it until its process is up."""

from __future__ import annotations

import itertools

import pytest

from harness import topology


def test_a_port_is_handed_out_once(monkeypatch):
    picks = itertools.cycle([topology.PORT_RANGE[0], topology.PORT_RANGE[0] + 1])
    monkeypatch.setattr(topology.hosts, "free_port_in", lambda host, low, high: next(picks))
    monkeypatch.setattr(topology, "_HANDED_OUT", set())
    assert {topology.free_port(), topology.free_system_port()} == {
        topology.PORT_RANGE[0], topology.PORT_RANGE[0] + 1}
    with pytest.raises(RuntimeError, match="not handed out"):
        topology.free_port()


def test_real_picks_are_distinct_and_in_this_workers_range():
    low, high = topology.PORT_RANGE
    ports = [topology.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(low <= port <= high for port in ports)
