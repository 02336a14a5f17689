"""What a client may pass to the chat template: template variables only, within a size budget.

`apply_chat_template(messages, **kwargs)` takes its own parameters from the same kwargs, so a
client could replace the template (`chat_template`), make it return ids or tensors
(`tokenize`, `return_tensors`, `return_dict`), or change the prompt's shape
(`add_generation_prompt`, `continue_final_message`, `tools`, `documents`). Those keys are
refused with a 400 naming them; the variables the model's own template reads (e.g.
`enable_thinking`) pass.
"""

import json
from typing import Any

from handlers.core.errors import RequestError

# The parameters of transformers 5.24's PreTrainedTokenizerBase.apply_chat_template (a test
# checks this list against the installed signature), plus the legacy `chat_template_kwargs`
# wrapper some versions accept.
RESERVED_KEYS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs", "kwargs", "chat_template_kwargs",
})

# Template variables are flags and short strings; 16 KiB of JSON is far above any real use
# and keeps rendering cost bounded by the messages, not by the variables.
MAX_KWARGS_BYTES = 16 * 1024
MAX_KWARGS_KEYS = 64


def check_template_kwargs(kwargs: dict[str, Any], field: str) -> dict[str, Any]:
    """Return `kwargs` if they are template variables within budget; else RequestError."""
    if len(kwargs) > MAX_KWARGS_KEYS:
        raise RequestError(f"{field}: at most {MAX_KWARGS_KEYS} template variables, "
                           f"got {len(kwargs)}")
    for key in kwargs:
        if key in RESERVED_KEYS:
            raise RequestError(
                f"{field}.{key}: not a template variable (it is a parameter of the chat "
                "template call, which the worker sets itself)")
        if not key.isidentifier():
            raise RequestError(f"{field}: {key[:64]!r} is not a valid template variable name")
    size = len(json.dumps(kwargs, ensure_ascii=False))
    if size > MAX_KWARGS_BYTES:
        raise RequestError(f"{field}: {size} bytes of template variables, at most "
                           f"{MAX_KWARGS_BYTES} are allowed")
    return kwargs
