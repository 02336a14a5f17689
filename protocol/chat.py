"""Text-mode request: the raw OpenAI chat-completions body a `ModelInput.Text` worker receives.

Unknown fields are tolerated (extra="allow"): the frontend forwards the client's body as is
(what the 1.6.1 frontend forwards in Text mode), including extensions such as `nvext`.
"""

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from protocol.limits import MAX_CHOICES, MAX_TOKENS_LIMIT
from protocol.preprocessed import TokenId
from protocol.sampling_rules import MinP, Penalty, RepetitionPenalty, Seed, Temperature, TopK, TopP
from protocol.tools import ToolChoice, ToolDef

Role = Literal["system", "user", "assistant", "tool", "developer"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    # A list of text parts is joined into one string (OpenAI semantics), so chat templates
    # that expect string content work; this model serves text only.
    content: Optional[str] = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"part [{i}] must be {{'type': 'text', 'text': ...}}")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part [{i}].text must be a string")
            texts.append(part["text"])
        return "".join(texts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False
    continuous_usage_stats: bool = False  # usage on every chunk (with include_usage)


class NvExt(BaseModel):
    """Dynamo's `nvext` extension. `token_data` is a pre-tokenized prompt: the 1.6.1 frontend
    forwards it to a Text-mode worker unchecked, so the worker validates the ids itself."""

    model_config = ConfigDict(extra="allow")

    token_data: Optional[list[TokenId]] = Field(default=None, min_length=1)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(min_length=1)
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    min_tokens: Optional[int] = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[TopK] = None
    min_p: Optional[MinP] = None
    n: Optional[int] = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[TokenId]] = None
    seed: Optional[Seed] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    repetition_penalty: Optional[RepetitionPenalty] = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    # The 1.6.1 frontend forwards the client's chat_template_kwargs under this name, and adds
    # its own template variables there (reasoning_effort -> enable_thinking, ...).
    chat_template_args: Optional[dict[str, Any]] = None
    nvext: Optional[NvExt] = None
    tools: Optional[list[ToolDef]] = Field(default=None, max_length=512)
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and any(s == "" for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @property
    def completion_limit(self) -> Optional[int]:
        """max_completion_tokens wins over the deprecated max_tokens (OpenAI semantics)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_usage(self) -> bool:
        """A usage chunk closes the stream when asked for, and always for non-streaming."""
        if not self.stream:
            return True
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def wants_continuous_usage(self) -> bool:
        """Usage on every streamed chunk: both stream options set, as the frontend requires
        in Tokens mode."""
        opts = self.stream_options
        return self.stream and opts is not None and opts.include_usage and (
            opts.continuous_usage_stats)

    @property
    def prompt_token_ids(self) -> Optional[list[int]]:
        """The client's own prompt ids (`nvext.token_data`), which replace the chat template."""
        return self.nvext.token_data if self.nvext is not None else None

    @property
    def template_kwargs_field(self) -> Optional[str]:
        """Which field carries the template variables (named in errors), if any."""
        if self.chat_template_kwargs:
            return "chat_template_kwargs"
        return "chat_template_args" if self.chat_template_args else None

    def template_kwargs(self) -> dict[str, Any]:
        """Template variables; the client's own chat_template_kwargs win over the frontend's."""
        return {**(self.chat_template_args or {}), **(self.chat_template_kwargs or {})}

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]
