"""The handlers' error types. The worker component translates them at the runtime boundary:
RequestError -> Dynamo's InvalidArgument (HTTP 400 with the message), PrefillUnavailable and
EngineUnavailable -> HTTP 503, anything else -> 500.
handlers/ never imports Dynamo."""


class HandlerError(Exception):
    """Base of the errors a handler raises on purpose."""

    @property
    def message(self) -> str:
        return str(self)


class RequestError(HandlerError):
    """The client's request is wrong; the message says what (shown to the client)."""


class EngineError(HandlerError):
    """The engine (or the prefill worker) failed the request; not the client's fault."""


class EngineUnavailable(EngineError):
    """The engine turned the request away for now (SGLang's 503 aborts: its queue is full, a
    decode retraction without a backup): HTTP 503, so a client or the frontend may retry."""


class PrefillError(EngineError):
    """The prefill worker did not deliver: no bootstrap info in time, or its stream failed."""


class PrefillUnavailable(PrefillError):
    """No prefill worker answered in time (hung, or none accepted the connection): HTTP 503."""
