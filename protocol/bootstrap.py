"""Where decode's engine meets prefill's: the prefill engine's bootstrap server plus a room."""

import functools
import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM

# SGLang's FAKE_BOOTSTRAP_HOST: a request with it moves no KV (health checks, warm-up); each
# engine completes it alone, with any room (0 included).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"

# One DNS label (RFC 1123): letters, digits and inner hyphens, at most 63 characters.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def host_problem(host: object) -> str | None:
    """Why ``host`` cannot be dialled as a bootstrap server (None: a host name or a specific
    address; IPv6 may be bracketed). Wildcards (``*``, 0.0.0.0, ::), spaces and URLs are
    refused: they name no peer, and ZMQ raises on them inside ``connect``."""
    if not isinstance(host, str) or not host:
        return f"must be a non-empty host name or address, got {host!r}"
    if len(host) > 255:  # no name or address is longer: nothing that size is cached
        return f"must be a host name or IP address, got {host[:64]!r}"
    return _str_host_problem(host)


@functools.lru_cache(maxsize=256)  # every request names one of a few prefill hosts
def _str_host_problem(host: str) -> str | None:
    try:
        addr = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
            return f"must be a host name or IP address, got {host[:64]!r}"
        return None
    if addr.is_unspecified or addr.is_multicast:
        return f"must be a specific address, not {host!r}"
    return None


def choice_room(room: int, index: int) -> int:
    """The room of choice ``index`` of an ``n > 1`` request in ``room`` where each choice needs
    a room of its own (SGLang's ``room + i``, wrapped within [1, 2^63)): both legs derive the
    same rooms from the one the frontend or the prefill drew."""
    span = MAX_BOOTSTRAP_ROOM - MIN_BOOTSTRAP_ROOM + 1
    return (room - MIN_BOOTSTRAP_ROOM + index) % span + MIN_BOOTSTRAP_ROOM


class BootstrapInfo(BaseModel):
    """The prefill handler's first stream item.

    Extra keys (1.6.1's `handoff_id`, which is bytes) are ignored so they never need JSON
    encoding.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    bootstrap_host: str = Field(min_length=1)
    bootstrap_port: StrictInt = Field(ge=1, le=65535)
    bootstrap_room: StrictInt = Field(ge=MIN_BOOTSTRAP_ROOM, le=MAX_BOOTSTRAP_ROOM)

    @field_validator("bootstrap_host")
    @classmethod
    def _host(cls, value: str) -> str:
        problem = host_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value
