"""Fields this worker does not implement: a request that sets one gets a 400 naming it, rather
than a 200 that silently ignored it (a client asking for JSON must not get prose).

Only a field present with a non-default value is refused (`echo: false`, `tools: []` are
fine). In Tokens mode the 1.6.1 frontend turns `prompt_logprobs` (and completions' `echo`)
into `output_options.prompt_logprobs`, served (`handlers/core/logprobs.py`; disaggregated:
`handlers/disagg/prompt_logprobs.py`), and
image/audio/video content parts into `multi_modal_data`; it drops `logit_bias` and handles
`tools` itself, so those never reach a Tokens-mode worker. Structured output
(`response_format`, `guided_*`, `sampling_options.guided_decoding`) is implemented in
`handlers/core/guided.py`, logprobs in `handlers/core/logprobs.py`.
"""

from typing import Any, Callable, Optional

from handlers.core.errors import RequestError
from protocol.chat import ChatCompletionRequest
from protocol.preprocessed import PreprocessedRequest


def _set(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _not(default: Any) -> Callable[[Any], bool]:
    return lambda value: value is not None and value != default


def _tool_choice(value: Any) -> bool:
    return value is not None and value != "none"


def _modalities(value: Any) -> bool:
    return value is not None and value != ["text"]


# OpenAI body field -> (is it set to something we would have to honour?, what it asks for)
_TEXT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    # `tools` and `tool_choice` are served (handlers/text/tool_calls.py); the legacy names are not.
    "functions": (_set, "legacy function calling; use tools"),
    "function_call": (_tool_choice, "legacy function calling; use tool_choice"),
    "structured_outputs": (_set, "structured output"),
    "prompt_logprobs": (_not(None), "prompt logprobs"),
    "logit_bias": (_set, "logit bias"),
    "best_of": (_not(1), "best-of sampling"),
    "use_beam_search": (_set, "beam search"),
    "length_penalty": (_not(1.0), "beam search"),
    "echo": (_set, "prompt echo"),
    "modalities": (_modalities, "non-text output"),
    "audio": (_not(None), "audio output"),
    "prediction": (_not(None), "predicted outputs"),
}


def _refuse(field: str, what: str) -> RequestError:
    return RequestError(f"{field}: not supported by this worker ({what} is not implemented); "
                        "remove the field")


def check_text_request(req: ChatCompletionRequest) -> None:
    body = {**(req.model_extra or {})}
    for field, (is_set, what) in _TEXT_FIELDS.items():
        if is_set(body.get(field)):
            raise _refuse(field, what)


def _first_set(pairs: list[tuple[str, Any, str]]) -> Optional[tuple[str, str]]:
    for field, value, what in pairs:
        if value:
            return field, what
    return None


def check_tokens_request(req: PreprocessedRequest) -> None:
    opts = req.sampling_options
    hit = _first_set([
        ("sampling_options.best_of", _not(1)(opts.best_of), "best-of sampling"),
        ("sampling_options.use_beam_search", bool(opts.use_beam_search), "beam search"),
        ("sampling_options.length_penalty", _not(1.0)(opts.length_penalty), "beam search"),
        ("multi_modal_data (image, audio or video content parts)", _set(req.multi_modal_data),
         "multimodal input"),
    ])
    if hit is not None:
        raise _refuse(*hit)
