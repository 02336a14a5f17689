"""What workers yield, per token or per text delta: msgspec Structs (cheap to build and encode).

The Dynamo runtime takes plain dicts; `to_wire(struct)` converts with `msgspec.to_builtins`,
which honours `omit_defaults` (absent keys rather than nulls where the frontend expects that).
"""

from typing import Any, Optional, Union

import msgspec

FINISH_REASONS = ("stop", "length", "content_filter", "cancelled")


class PromptTokensDetails(msgspec.Struct, omit_defaults=True):
    cached_tokens: int = 0


class CompletionUsage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class TopLogprob(msgspec.Struct):
    """Tokens mode, Dynamo's shape: one alternative at one position, ``rank`` from 1. ``token``
    is null: the frontend, which has the tokenizer, fills the text."""

    rank: int
    token_id: int
    token: Optional[str]
    logprob: float


class TokenDelta(msgspec.Struct, omit_defaults=True):
    """Tokens mode: disjoint new token ids of one choice; the last one has the finish reason.
    With logprobs: ``log_probs`` and ``top_logprobs`` align with ``token_ids`` by position."""

    token_ids: list[int]
    index: int = 0
    finish_reason: Optional[str] = None
    completion_usage: Optional[CompletionUsage] = None
    log_probs: Optional[list[float]] = None
    top_logprobs: Optional[list[list[TopLogprob]]] = None
    # On the last delta: SGLang's matched_stop, which the 1.6.1 frontend shows as
    # `nvext.stop_reason`, and `engine_data.prompt_logprobs` (its `nvext.prompt_logprobs`).
    stop_reason: Optional[Union[str, int]] = None
    engine_data: Optional[dict[str, Any]] = None


class ChatFunctionDelta(msgspec.Struct, omit_defaults=True):
    arguments: str  # no default: always sent, "" on a call's first delta as OpenAI does
    name: Optional[str] = None  # on a call's first delta only


class ChatToolCallDelta(msgspec.Struct, omit_defaults=True):
    """OpenAI's streamed `tool_calls[]` entry: `id` and `type` on a call's first delta, then
    argument text under the same `index`."""

    index: int
    function: ChatFunctionDelta
    id: Optional[str] = None
    type: Optional[str] = None


class ChatDelta(msgspec.Struct, omit_defaults=True):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None  # split off by the worker's reasoning parser
    tool_calls: Optional[list[ChatToolCallDelta]] = None


class ChatTopLogprob(msgspec.Struct):
    """OpenAI's ``top_logprobs[]`` entry; ``bytes`` are the token's UTF-8 bytes."""

    token: str
    logprob: float
    bytes: Optional[list[int]]


class ChatTokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: Optional[list[int]]
    top_logprobs: list[ChatTopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob]


class ChatChoice(msgspec.Struct, omit_defaults=True):
    index: int
    delta: ChatDelta
    finish_reason: Optional[str]  # always sent (no default), null until the choice ends
    logprobs: Optional[ChoiceLogprobs] = None


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True):
    """Text mode: one `chat.completion.chunk`; `choices=[]` plus `usage` closes the stream."""

    id: str
    created: int
    model: str
    object: str  # no default, so omit_defaults never drops it: "chat.completion.chunk"
    choices: list[ChatChoice]
    usage: Optional[CompletionUsage] = None
    # Dynamo's extension: the one part of a Text-mode chunk the 1.6.1 frontend passes on as
    # is (it drops fields it does not know, such as a choice's `matched_stop`).
    nvext: Optional[dict[str, Any]] = None


CHUNK_OBJECT = "chat.completion.chunk"


def to_wire(struct: msgspec.Struct) -> dict[str, Any]:
    return msgspec.to_builtins(struct)
