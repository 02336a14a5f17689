"""Per-request timings of the CPU engine, read from its DEBUG log records.

The engine logs, on its own thread and at the moment they happen: the prefill forward
("prefill rid=%s %d tokens in %.1f ms") and, on a prefill engine, the KV WRITE being posted and
completed ("room %s: WRITE of %d runs posted", "room %s (rid %s): KV WRITE done"). A record's
`created` is wall-clock time (time.time()), comparable across processes on one machine. If the
engine's messages change, the fields stay empty and the benchmark says so instead of guessing.
"""

from __future__ import annotations

import logging
import threading

ENGINE_LOGGER = "components.engine"


class TimingCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._lock = threading.Lock()
        self.prefill: dict[str, tuple[float, float]] = {}  # rid -> (end time, compute ms)
        self.write_posted: dict[int, float] = {}  # room -> time
        self.write_done: dict[int, float] = {}  # room -> time

    def emit(self, record: logging.LogRecord) -> None:
        msg, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        with self._lock:
            if msg.startswith("prefill rid=") and len(args) == 3:
                self.prefill[str(args[0])] = (record.created, float(args[2]))
            elif "WRITE of" in msg and "posted" in msg and args:
                self.write_posted[int(args[0])] = record.created
            elif msg.endswith("KV WRITE done") and args:
                self.write_done[int(args[0])] = record.created

    def request(self, rid: str, room: int | None) -> dict[str, float | None]:
        """One request's times as plain values (None where the engine logged nothing)."""
        with self._lock:
            end, compute_ms = self.prefill.get(rid, (None, None))
            return {"prefill_end": end, "prefill_ms": compute_ms,
                    "write_posted": self.write_posted.get(room),
                    "write_done": self.write_done.get(room)}

    @classmethod
    def install(cls) -> "TimingCapture":
        """Capture the engine's DEBUG records without printing them: other handlers keep
        their level (the root handler is pinned to INFO if it has none)."""
        for handler in logging.getLogger().handlers:
            if handler.level == logging.NOTSET:
                handler.setLevel(logging.INFO)
        capture = cls()
        engine_logger = logging.getLogger(ENGINE_LOGGER)
        engine_logger.setLevel(logging.DEBUG)
        engine_logger.addHandler(capture)
        return capture
