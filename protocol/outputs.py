"""What workers yield, per token or per text delta: msgspec Structs (cheap to build and encode).

The Dynamo runtime takes plain dicts; `to_wire(struct)` converts with `msgspec.to_builtins`,
which honours `omit_defaults` (absent keys rather than nulls where the frontend expects that).
"""

from typing import Any, Optional

import msgspec

FINISH_REASONS = ("stop", "length", "content_filter", "cancelled")


class PromptTokensDetails(msgspec.Struct, omit_defaults=True):
    cached_tokens: int = 0


class CompletionUsage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class TokenDelta(msgspec.Struct, omit_defaults=True):
    """Tokens mode: disjoint new token ids of one choice; the last one has the finish reason."""

    token_ids: list[int]
    index: int = 0
    finish_reason: Optional[str] = None
    completion_usage: Optional[CompletionUsage] = None


class ChatDelta(msgspec.Struct, omit_defaults=True):
    role: Optional[str] = None
    content: Optional[str] = None


class ChatChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    finish_reason: Optional[str]  # always sent, null until the choice ends (OpenAI shape)


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True):
    """Text mode: one `chat.completion.chunk`; `choices=[]` plus `usage` closes the stream."""

    id: str
    created: int
    model: str
    object: str  # no default, so omit_defaults never drops it: "chat.completion.chunk"
    choices: list[ChatChoice]
    usage: Optional[CompletionUsage] = None


CHUNK_OBJECT = "chat.completion.chunk"


def to_wire(struct: msgspec.Struct) -> dict[str, Any]:
    return msgspec.to_builtins(struct)
