"""Messages between a CPU engine and the tokenizer workers attached to it (msgpack, no pickle).

A worker process (``AttachedCpuEngine``) talks to the engine process (``EngineService``) over one
ZMQ DEALER/ROUTER pair on a Unix socket. Requests carry token ids (the worker tokenizes); replies
are the engine's chunks exactly as ``CpuEngine.async_generate`` yields them.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Union

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


ToEngine = Union[Hello, Generate, Abort, PagesQuery]
ToWorker = Union[Info, Chunk, Refused, Pages]

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
