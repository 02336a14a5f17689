"""Where decode's engine meets prefill's: the prefill engine's bootstrap server plus a room."""

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from protocol.limits import MAX_BOOTSTRAP_ROOM, MIN_BOOTSTRAP_ROOM

# SGLang's FAKE_BOOTSTRAP_HOST: a request with it moves no KV (health checks, warm-up); each
# engine completes it alone, with any room (0 included).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class BootstrapInfo(BaseModel):
    """The prefill handler's first stream item.

    Extra keys (1.6.1's `handoff_id`, which is bytes) are ignored so they never need JSON
    encoding.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    bootstrap_host: str = Field(min_length=1)
    bootstrap_port: StrictInt = Field(ge=1, le=65535)
    bootstrap_room: StrictInt = Field(ge=MIN_BOOTSTRAP_ROOM, le=MAX_BOOTSTRAP_ROOM)
