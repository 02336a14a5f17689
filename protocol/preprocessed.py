"""Tokens-mode request, as the Dynamo 1.6.1 frontend sends it to a `ModelInput.Tokens` worker.

Mirrors `lib/llm/src/protocols/common/preprocessor.rs` (Dynamo 1.6.1). Unknown fields are kept
(extra="allow") so newer frontends keep working; the handlers read only the fields named here.
"""

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from protocol.bootstrap import BootstrapInfo
from protocol.limits import MAX_CHOICES, MAX_TOKENS_LIMIT
from protocol.sampling_rules import MinP, Penalty, RepetitionPenalty, Seed, Temperature, TopK, TopP

TokenId = Annotated[StrictInt, Field(ge=0)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class StopConditions(_Wire):
    max_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[TokenId]] = None
    stop_token_ids_visible: Optional[list[TokenId]] = None
    stop_token_ids_hidden: Optional[list[TokenId]] = None
    min_tokens: Optional[int] = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    ignore_eos: Optional[bool] = None
    max_thinking_tokens: Optional[int] = Field(default=None, ge=0)


class SamplingOptions(_Wire):
    n: Optional[int] = Field(default=None, ge=1, le=MAX_CHOICES)
    best_of: Optional[int] = Field(default=None, ge=1)
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    repetition_penalty: Optional[RepetitionPenalty] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[TopK] = None
    min_p: Optional[MinP] = None
    use_beam_search: Optional[bool] = None
    length_penalty: Optional[float] = None
    seed: Optional[Seed] = None
    include_stop_str_in_output: Optional[bool] = None
    guided_decoding: Optional[dict[str, Any]] = None


class OutputOptions(_Wire):
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: Optional[bool] = None
    formatted_prompt: Optional[bool] = None
    return_tokens_as_token_ids: Optional[bool] = None


class PreprocessedRequest(_Wire):
    token_ids: list[TokenId] = Field(min_length=1)
    stop_conditions: StopConditions = Field(default_factory=StopConditions)
    sampling_options: SamplingOptions = Field(default_factory=SamplingOptions)
    output_options: OutputOptions = Field(default_factory=OutputOptions)
    eos_token_ids: list[TokenId] = Field(default_factory=list)
    mdc_sum: Optional[str] = None
    annotations: list[str] = Field(default_factory=list)
    model: Optional[str] = None
    routing: Optional[dict[str, Any]] = None
    bootstrap_info: Optional[BootstrapInfo] = None
    multi_modal_data: Optional[dict[str, Any]] = None

    def wire_dict(self) -> dict[str, Any]:
        """The known fields only, None dropped: safe to forward (extras may hold bytes)."""
        return self.model_dump(exclude=set(self.model_extra or ()), exclude_none=True)
