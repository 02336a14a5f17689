"""``RemoteCpuEngine``: the CPU engine's API in the worker, run by an engine process the worker
owns (``--cpu-engine-process separate``; ``launch.py`` starts it, ``serve.py`` runs it).

Requests, aborts and refusals work as for a tokenizer worker (``AttachedCpuEngine``). On top:
- read-outs (``/engine/*``, ``/metrics``) return the latest ``wire.Readouts`` the engine process
  pushed (``publish.py``): no round trip, nothing that blocks the caller's event loop;
- ``set_kv_event_listener`` subscribes; the engine's listener calls arrive on the worker's event
  loop and are made there, in order (the relay only enqueues, as on the engine thread);
- ``end_all`` ends every live request at once (the worker calls it when its pidfd says the
  engine process exited); ``shutdown`` stops the engine process (bounded).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from typing import Any

from components.engine.api.readouts import EngineReadouts
from components.engine.api.totals import Totals
from components.engine.disagg.transport.prefill_writes import TransferTotals
from components.engine.kv.events import KvEventListener
from components.engine.process import wire
from components.engine.process.attached import AttachedCpuEngine
from components.engine.process.launch import stop_engine_process

logger = logging.getLogger(__name__)

_KV_CALLS = ("blocks_stored", "blocks_removed", "load")


class RemoteCpuEngine(AttachedCpuEngine):
    _watch_interval_s = None  # the worker watches its engine process's pidfd instead

    def __init__(self, proc: subprocess.Popen) -> None:
        self.engine_process = proc
        self.closed = False
        super().__init__(proc.pid)
        self._readouts = wire.Readouts()
        self._listener: KvEventListener | None = None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the connection opens with the first request
        self._ensure_receiver()  # read-outs flow from the start

    def _ensure_receiver(self) -> None:
        if self._receiver is None:
            super()._ensure_receiver()
            self._send(wire.Subscribe(kv_events=self._listener is not None))

    def _pushed(self, msg: Any) -> None:
        if isinstance(msg, wire.Readouts):
            self._readouts = msg
        elif isinstance(msg, wire.KvEvents) and self._listener is not None:
            for name, args in msg.calls:
                if name in _KV_CALLS:
                    getattr(self._listener, name)(*args)

    def set_kv_event_listener(self, listener: KvEventListener) -> None:
        """Report the engine's cached blocks and load to ``listener``, called on this process's
        event loop (earlier blocks are not replayed, as in-process)."""
        self._listener = listener
        if self._receiver is None:
            self._ensure_receiver()
        else:
            self._send(wire.Subscribe(kv_events=True))

    # ---- read-outs: the latest pushed ---------------------------------------------------------
    def kv_pages_in_use(self) -> int:
        return self._readouts.kv_pages_in_use

    def kv_pages_total(self) -> int:
        return int(self._facts["num_pages"])

    def kv_pages_cached(self) -> int:
        return self._readouts.kv_pages_cached

    def requests_in_flight(self) -> int:
        return self._readouts.requests_in_flight

    def rid_in_flight(self, rid: str) -> bool:
        return rid in self._queues

    def queue_depth(self) -> int:
        return self._readouts.queue_depth

    def prefix_hit_tokens(self) -> int:
        return self._readouts.prefix_hit_tokens

    def request_totals(self) -> Totals:
        requests, prompt, generation, cached = self._readouts.totals
        return Totals(requests=requests, prompt_tokens=prompt, generation_tokens=generation,
                      cached_tokens=cached)

    def kv_transfer_totals(self) -> TransferTotals | None:
        t = self._readouts.transfers
        return None if t is None else TransferTotals(writes=t[0], nbytes=t[1], seconds=t[2])

    def get_server_info(self) -> dict[str, Any]:
        # The in-process engine's, from the same settings and registration facts.
        return EngineReadouts.get_server_info(self)

    # ---- lifecycle ----------------------------------------------------------------------------
    def end_all(self) -> int:
        """The engine process exited: end every live request now (an engine error, not a 400);
        how many. Later requests raise RuntimeError."""
        count = len(self._queues)
        self._engine_gone()
        return count

    def shutdown(self) -> None:
        """Close the connection, then stop the engine process (it aborts what still runs)."""
        self.closed = True  # its exit from here on is the one asked for
        super().shutdown()
        stop_engine_process(self.engine_process)
