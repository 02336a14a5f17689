"""Messages between a CPU engine and the processes attached to it (msgpack, no pickle).

A worker process (``AttachedCpuEngine``, or ``RemoteCpuEngine`` in the worker that owns an engine
process, ``--cpu-engine-process separate``) talks to the engine process (``EngineService``) over
one ZMQ DEALER/ROUTER pair on a Unix socket. Requests carry token ids (the worker tokenizes);
replies are the engine's chunks exactly as ``CpuEngine.async_generate`` yields them. A worker
that subscribes also gets the engine's read-outs (``Readouts``, pushed when they change) and, once
it sets a KV event listener, the listener's calls (``KvEvents``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional, Union

import msgspec


class Hello(msgspec.Struct, tag="hello"):
    pid: int


class Info(msgspec.Struct, tag="info"):
    server_args: dict[str, Any]
    facts: dict[str, Any]  # page_size, context_length, vocab_size, eos_token_ids, ...


class Generate(msgspec.Struct, tag="generate"):
    rid: str
    kwargs: dict[str, Any]  # async_generate keyword arguments (msgpack-able ones only)


class Abort(msgspec.Struct, tag="abort"):
    rid: str


class PagesQuery(msgspec.Struct, tag="pages"):
    pass


class Pages(msgspec.Struct, tag="pages_reply"):
    in_use: int


class Chunk(msgspec.Struct, tag="chunk"):
    """A streamed chunk, or the whole result of a request without streaming (a list of the
    choices' outputs when n > 1)."""

    rid: str
    chunk: Any


class Refused(msgspec.Struct, tag="refused"):
    """The engine raised at the call or the first read: ``ValueError`` (the request's fault,
    a 400) or anything else (the engine's)."""

    rid: str
    message: str
    invalid: bool


class Subscribe(msgspec.Struct, tag="subscribe"):
    """Push ``Readouts`` to this peer whenever they change (and once at once); with
    ``kv_events`` also forward the engine's KV event listener calls (``KvEvents``)."""

    kv_events: bool = False


class Readouts(msgspec.Struct, tag="readouts", frozen=True):
    """The engine's read-outs (``components/engine/api/readouts.py``) at one moment. Sent ahead
    of a request's final chunk on the same connection, so a caller that saw a request end reads
    read-outs that count it."""

    kv_pages_in_use: int = 0
    kv_pages_cached: int = 0
    requests_in_flight: int = 0
    queue_depth: int = 0
    prefix_hit_tokens: int = 0
    totals: tuple[int, int, int, int] = (0, 0, 0, 0)  # requests, prompt, generation, cached
    transfers: Optional[tuple[int, int, float]] = None  # prefill: writes, bytes, seconds


class KvEvents(msgspec.Struct, tag="kv_events"):
    """KV event listener calls in the engine's order: (method name, positional arguments)."""

    calls: list[tuple[str, list[Any]]]


Single = Union[Info, Chunk, Refused, Pages, Readouts, KvEvents]


class Batch(msgspec.Struct, tag="batch"):
    """Several messages to one worker in one ZMQ message, in order (``outbox.py``)."""

    items: list[Single]


ToEngine = Union[Hello, Generate, Abort, PagesQuery, Subscribe]
ToWorker = Union[Info, Chunk, Refused, Pages, Readouts, KvEvents, Batch]

encode = msgspec.msgpack.Encoder().encode
decode_to_engine = msgspec.msgpack.Decoder(ToEngine).decode
decode_to_worker = msgspec.msgpack.Decoder(ToWorker).decode


def service_dir(parent_pid: int) -> str:
    """Where an engine process with tokenizer workers keeps its socket (mode 0700)."""
    return os.path.join(tempfile.gettempdir(), f"cpu-engine-{parent_pid}")


def service_address(parent_pid: int) -> str:
    return "ipc://" + os.path.join(service_dir(parent_pid), "engine.sock")


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in (b"Z", b"X")
