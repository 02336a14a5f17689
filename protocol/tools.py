"""OpenAI's tool-calling fields of a chat body (Text mode): `tools`, `tool_choice`,
`parallel_tool_calls`, checked for shape only. What a tool's `parameters` schema allows is the
tool-call parser's and the grammar compiler's business (components/backends/sglang_parsers.py).
"""

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

ToolChoiceMode = Literal["none", "auto", "required"]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=256)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: call exactly this tool."""

    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Union[ToolChoiceMode, NamedToolChoice]


def tool_choice_name(choice: Optional[ToolChoice]) -> Optional[str]:
    """The named tool, or None for a mode (or no choice)."""
    return choice.function.name if isinstance(choice, NamedToolChoice) else None
