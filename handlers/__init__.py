"""Request handlers: input routing, sampling mapping, prefill, decode, streaming.

Imports protocol/ and the standard library (plus jinja2 for template errors); never Dynamo,
SGLang or torch. The worker component wires engines, clients and the runtime to these.
"""

from handlers.core.base import BaseHandler, Context, Engine, PrefillClient, TokenizerManager
from handlers.decode import DecodeConfig, DecodeHandler
from handlers.core.errors import (
    EngineError, HandlerError, PrefillError, PrefillUnavailable, RequestError,
)
from handlers.core.health import HEALTH_CHECK_KEY, decode_health_payload, prefill_health_payload
from handlers.disagg.orchestration import Orchestration
from handlers.prefill import PrefillConfig, PrefillHandler
from handlers.text.preprocess import PreprocessConfig, Preprocessor
from protocol.bootstrap import FAKE_BOOTSTRAP_HOST

__all__ = [
    "BaseHandler",
    "Context",
    "DecodeConfig",
    "DecodeHandler",
    "Engine",
    "EngineError",
    "FAKE_BOOTSTRAP_HOST",
    "HEALTH_CHECK_KEY",
    "HandlerError",
    "Orchestration",
    "PrefillClient",
    "PrefillConfig",
    "PrefillError",
    "PrefillHandler",
    "PrefillUnavailable",
    "PreprocessConfig",
    "Preprocessor",
    "RequestError",
    "TokenizerManager",
    "decode_health_payload",
    "prefill_health_payload",
]
