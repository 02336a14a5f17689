"""Wire types only: pydantic models at the edges, msgspec structs on hot paths.

Imports nothing but pydantic, msgspec and the standard library.
"""

from protocol.bootstrap import BootstrapInfo
from protocol.chat import ChatCompletionRequest, ChatMessage, StreamOptions
from protocol.disagg import DisaggPreprocessedRequest, PrefillDone
from protocol.outputs import (
    CHUNK_OBJECT,
    FINISH_REASONS,
    ChatChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionUsage,
    PromptTokensDetails,
    TokenDelta,
    to_wire,
)
from protocol.preprocessed import (
    OutputOptions,
    PreprocessedRequest,
    SamplingOptions,
    StopConditions,
)
from protocol.validation import ProtocolError, describe_validation_error, parse

__all__ = [
    "BootstrapInfo",
    "CHUNK_OBJECT",
    "ChatChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatMessage",
    "CompletionUsage",
    "DisaggPreprocessedRequest",
    "FINISH_REASONS",
    "OutputOptions",
    "PrefillDone",
    "PreprocessedRequest",
    "PromptTokensDetails",
    "ProtocolError",
    "SamplingOptions",
    "StopConditions",
    "StreamOptions",
    "TokenDelta",
    "describe_validation_error",
    "parse",
    "to_wire",
]
