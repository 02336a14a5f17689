"""Decode -> prefill hand-off: the request decode sends and the items prefill streams back.

Stream contract of the prefill endpoint: first item a `BootstrapInfo` dict, last item a
`PrefillDone` dict; a failure is raised (or sent as an item with an "error" key).
"""

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from protocol.bootstrap import BootstrapInfo
from protocol.preprocessed import PreprocessedRequest

__all__ = ["BootstrapInfo", "DisaggPreprocessedRequest", "PrefillDone"]


class PrefillDone(BaseModel):
    """The prefill stream's last item: its engine finished (the KV transfer went through)."""

    model_config = ConfigDict(extra="allow")

    finished: bool = True
    prompt_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)


class DisaggPreprocessedRequest(BaseModel):
    """What decode sends to the prefill endpoint.

    `request` always carries token ids (also in Text mode: decode tokenizes once and sends
    ids, so the prompt is never tokenized twice); `sampling_params` are the SGLang sampling
    params decode already mapped.
    """

    model_config = ConfigDict(extra="allow")

    request: PreprocessedRequest
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    data_parallel_rank: Optional[int] = Field(default=None, ge=0)
