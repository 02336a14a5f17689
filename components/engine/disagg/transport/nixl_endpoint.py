"""One NIXL agent (UCX backend, DRAM) with the engine's KV pool registered once.

The agent is created WITHOUT NIXL's progress thread: with it, the Python wrapper hardcodes a
zero delay and the idle thread spins a whole core (measured on 2-core machines). UCX is instead
progressed by the owner's calls to ``state()`` (initiator) and ``notifs()`` (target), which the
transport makes from its ``poll()`` whenever a room is pending.

The UCX backend is created with ``ucx_error_handling_mode`` from ``Peering`` ("none" by
default). Under NIXL's default, "peer", the WRITE's flush does not complete until the *target*
has progressed UCX after the post (measured: against a target that does not progress, the
initiator stays PROC indefinitely), and NIXL posts the notification only once the flush is done,
so both wait for the decode's next poll (1 ms slices, or a whole decode step while it computes);
the first WRITE to a peer took 13.7-14.7 ms. Under "none" the puts, the flush and the
notification all complete inside ``transfer()``, the first WRITE included (0.7-0.8 ms;
bench_kv_transfer). A dead peer on this host failed the WRITE (NIXL_ERR_REMOTE_DISCONNECT) in
both modes; UCX guarantees that only under "peer", the better choice for RDMA between nodes.
UCX refuses to connect endpoints whose modes differ, so the Hello carries the mode.

No UCX environment is set here: on one kernel UCX's own choice moves the WRITE with its ``cma``
transport and the notification (an active message) through shared memory (``UCX_PROTO_INFO=y``:
put "zero-copy cma/memory" at every size, active messages "sysv/memory"); between machines both
go over tcp (or RDMA). The backend is created with ``ADAPTIVE_PROGRESS=n`` (this context only):
under UCX's default, "y", a worker polls only the interfaces its own endpoints use, and an idle
shared-memory interface is woken by the sender's signal over an abstract unix socket. The decode
never opens an endpoint to its prefill, so its shared-memory interface is woken that way, and
abstract unix sockets exist per network namespace: with prefill and decode in different network
namespaces of one kernel (two containers or pods on one node, or the multi-host tests' hosts)
the data landed (``cma``), the prefill's WRITE was DONE, and the notification sat unread in the
decode's shared-memory queue forever (``UCX_LOG_LEVEL=debug``: the sender's endpoint has lanes
sysv (am) and cma (rma_bw); nothing arrives on the decode). Polling every interface costs a few
microseconds per ``notifs()`` and makes the notification path independent of namespaces;
``UCX_TLS=tcp`` also worked, but moves the data over tcp instead of ``cma``.

``cma`` makes one ``process_vm_writev``
per descriptor *segment*: UCX cuts each descriptor into ``CMA_SEG_SIZE`` pieces (512 KiB by
default; strace: 16 calls for an 8 MiB descriptor, 64 for a 64-run room), which is what bounds
a WRITE here. The backend is created with ``CMA_SEG_SIZE=1g`` (NIXL's ``engine_config``, this
context only): one call per descriptor. ``UCX_TLS=cma,tcp,self`` measured the same bandwidth,
shared-memory-only choices fail to create the backend, ``NIXL_UCX_SGL_ENABLE=1`` gained nothing,
and a user's ``UCX_TLS`` / ``UCX_NET_DEVICES`` (other hosts, RDMA) stays theirs. The pool's huge
pages (``host_memory.py``) make each of those kernel copies cheaper.
"""

from __future__ import annotations

import logging
import os

import torch

from components.engine.disagg.transport.runs import Run, check_within
from protocol.kv_side_channel import PROBE_BYTES, PROBE_SLOTS

logger = logging.getLogger(__name__)

# UCX's cma segment: the most one process_vm_writev moves of a descriptor (UCX default 512k).
CMA_SEG_SIZE = "1g"
# Poll every UCX interface, not only those of our own endpoints (see the module docstring).
# The variable restores UCX's default ("y"), which loses notifications across namespaces: only
# for showing that such a loss fails the request (tests/e2e/test_e2e_multihost.py).
ADAPTIVE_PROGRESS_ENV = "DYN_KV_UCX_ADAPTIVE_PROGRESS"


def probe_pattern() -> bytes:
    """What a probe WRITE carries: every byte value once (a zeroed slot cannot match it)."""
    return bytes(range(256)) * (PROBE_BYTES // 256)


def engine_config(cma_seg_size: str | None) -> str:
    """NIXL's ``engine_config`` for the UCX context: comma-separated ``NAME=value`` (UCX's
    names without ``UCX_``; NIXL ignores a string it cannot split, e.g. with ``;``)."""
    items = [f"ADAPTIVE_PROGRESS={os.environ.get(ADAPTIVE_PROGRESS_ENV, 'n')}"]
    if cma_seg_size:  # None: UCX's default segment
        items.append(f"CMA_SEG_SIZE={cma_seg_size}")
    return ",".join(items)


def _nixl_errors() -> tuple[type[BaseException], ...]:
    """The exception classes NIXL calls raise (nixlBackendError, nixlNotFoundError, ...)."""
    import nixl

    found = tuple(
        obj for name, obj in vars(nixl).items()
        if name.startswith("nixl") and isinstance(obj, type) and issubclass(obj, Exception)
    )
    return found or (RuntimeError,)


class NixlEndpoint:
    """The process's NIXL agent plus the registered pool; used on one thread only."""

    def __init__(self, name: str, pool: torch.Tensor, ucx_error_handling: str = "none",
                 cma_seg_size: str | None = CMA_SEG_SIZE) -> None:
        if not isinstance(pool, torch.Tensor) or not pool.is_cpu:
            raise ValueError("the KV pool must be a CPU torch tensor")
        if not pool.is_contiguous() or pool.numel() == 0:
            raise ValueError(
                "the KV pool must be a non-empty contiguous tensor (NIXL registers it whole)")
        from nixl import nixl_agent, nixl_agent_config

        self.errors = _nixl_errors()
        config = nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False,
                                   backends=[])
        self._agent = nixl_agent(name, config)
        try:
            params = {"ucx_error_handling_mode": ucx_error_handling,
                      "engine_config": engine_config(cma_seg_size)}
            self._agent.create_backend("UCX", params)
        except self.errors as exc:
            raise RuntimeError(f"NIXL could not create its UCX backend ({exc}); KV transfer "
                               "is impossible") from exc
        if "UCX" not in self._agent.backends:
            raise RuntimeError("NIXL could not create its UCX backend; KV transfer is impossible")
        self.name = name
        self.ucx_error_handling = ucx_error_handling
        self._pool = pool  # keeps the registered memory alive
        self.base = pool.data_ptr()
        self.nbytes = pool.numel() * pool.element_size()
        self._reg = self._agent.register_memory(pool)
        # The KV path probe's buffer (path_probe.py): the decode's slots are written into, the
        # prefill's first slot holds the pattern it writes from.
        self.probe = torch.zeros(PROBE_SLOTS * PROBE_BYTES, dtype=torch.uint8)
        self.probe[:PROBE_BYTES] = torch.frombuffer(bytearray(probe_pattern()), dtype=torch.uint8)
        self.probe_base = self.probe.data_ptr()
        self._probe_reg = self._agent.register_memory(self.probe)
        self._peers: dict[str, bytes] = {}
        self._closed = False
        logger.info("NIXL agent %s registered %.1f MiB of KV pool", name, self.nbytes / 2**20)

    @property
    def metadata(self) -> bytes:
        return self._agent.get_agent_metadata()

    def check_local(self, runs: list[Run], what: str) -> None:
        check_within(runs, self.base, self.nbytes, what)

    # --- peers --------------------------------------------------------------------------------
    def add_peer(self, expected_name: str, metadata: bytes) -> None:
        """Load a peer's metadata; raises one of ``self.errors`` or ValueError if unusable.

        The caller (peers.py) decides who may use a name; NIXL itself refuses new metadata under
        a loaded name, so a known peer is never replaced here."""
        if self._peers.get(expected_name) == metadata:
            return
        loaded = self._agent.add_remote_agent(metadata)
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != expected_name:
            # Metadata of another agent: unload it only if this call loaded it (a replay of a
            # known peer's metadata must not disconnect that peer).
            if loaded not in self._peers:
                self._agent.remove_remote_agent(loaded)
            raise ValueError(
                f"peer said it is agent {expected_name!r} but its metadata names {loaded!r}")
        self._peers[expected_name] = metadata

    def has_peer(self, name: str) -> bool:
        return name in self._peers

    def remove_peer(self, name: str) -> None:
        if self._peers.pop(name, None) is None:
            return
        try:
            self._agent.remove_remote_agent(name)
        except self.errors as exc:
            logger.warning("NIXL: removing peer %s failed: %s", name, exc)

    # --- transfers ----------------------------------------------------------------------------
    def write(self, peer: str, src: list[Run], dst: list[Run], notif: bytes):
        """Post a WRITE of ``src`` (local) into ``dst`` (peer memory); returns (handle, state)."""
        local = self._agent.get_xfer_descs([(a, n, 0) for a, n in src], "DRAM")
        remote = self._agent.get_xfer_descs([(a, n, 0) for a, n in dst], "DRAM")
        handle = self._agent.initialize_xfer("WRITE", local, remote, peer, notif)
        try:
            state = self._agent.transfer(handle)
        except self.errors:
            self.release(handle)
            raise
        return handle, state

    def state(self, handle) -> str:
        """"DONE", "PROC" or "ERR"; also progresses UCX."""
        try:
            return self._agent.check_xfer_state(handle)
        except self.errors as exc:
            logger.warning("NIXL: transfer state check failed: %s", exc)
            return "ERR"

    def release(self, handle) -> bool:
        """Free a handle; an active one is cancelled. False if NIXL refused (still active)."""
        try:
            self._agent.release_xfer_handle(handle)
            return True
        except self.errors as exc:
            logger.warning("NIXL: could not release transfer handle: %s", exc)
            return False

    def notifs(self) -> list[tuple[str, bytes]]:
        """New notifications as (sending agent, message); also progresses UCX on the passive
        side. The sender is the name of the agent NIXL received it from (a connection a peer
        can make only with our metadata, which only the prefills we registered with have)."""
        got = self._agent.get_new_notifs()
        return [(str(agent), msg) for agent, msgs in got.items() for msg in msgs]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in list(self._peers):
            self.remove_peer(name)
        try:
            self._agent.deregister_memory(self._probe_reg)
            self._agent.deregister_memory(self._reg)
        except self.errors as exc:
            logger.warning("NIXL: deregistering the KV pool failed: %s", exc)
