"""Where decode's engine meets prefill's: the prefill engine's bootstrap server plus a room."""

import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM

# RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def check_host(value: str) -> str:
    """A host a decode engine can dial: a host name or a specific IP address (IPv6 may be
    bracketed). Wildcards (`*`, 0.0.0.0, ::), spaces and URLs are refused: the engine would
    hand them to a socket connect, which fails inside its step."""
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        address = None
    if address is not None:
        if address.is_unspecified:
            raise ValueError(f"must be a specific address, not the wildcard {value!r}")
        return value
    if len(value) > 253 or not all(_LABEL.match(label) for label in value.split(".")):
        raise ValueError(f"must be a host name or IP address, got {value[:64]!r}")
    return value


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
        return check_host(value)
