"""The request body of ``POST /v1/chat/completions``: validation and OpenAPI schema at once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool

from talaria.proxy.dialects.openai_models import (
    JSON_SCHEMA_DOC,
    OPEN,
    FunctionDef,
    OpenAICommon,
    ReasoningEffort,
    ToolMode,
)


class ChatContentPart(BaseModel):
    """A content part: text (joined into a string when all parts are), image, audio, file."""

    model_config = OPEN

    type: str
    text: str | None = None


class ChatFunctionCall(BaseModel):
    """The function an earlier tool call called, with its arguments."""

    model_config = OPEN

    name: str
    arguments: str | dict[str, Any] = ""


class ChatToolCall(BaseModel):
    """A tool call of an earlier assistant turn."""

    model_config = OPEN

    id: str | None = None
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class ChatMessage(BaseModel):
    """A message of the conversation."""

    model_config = OPEN

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ChatContentPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class ChatFunctionTool(BaseModel):
    """A function the model may call."""

    model_config = OPEN

    type: Literal["function"]
    function: FunctionDef


class ChatCustomTool(BaseModel):
    """A custom (free-text) tool: accepted, and not offered to the model."""

    model_config = OPEN

    type: Literal["custom"]
    custom: dict[str, Any]


class ChatFunctionName(BaseModel):
    """A function by name."""

    model_config = OPEN

    name: str = Field(min_length=1)


class ChatNamedToolChoice(BaseModel):
    """The named function must be called."""

    model_config = OPEN

    type: Literal["function"]
    function: ChatFunctionName


class ChatTextFormat(BaseModel):
    """Free text, or any JSON object."""

    model_config = OPEN

    type: Literal["text", "json_object"]


class ChatJsonSchema(BaseModel):
    """The JSON schema the reply must follow."""

    model_config = OPEN

    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description=JSON_SCHEMA_DOC)
    strict: StrictBool | None = None


class ChatJsonSchemaFormat(BaseModel):
    """A reply that follows a JSON schema."""

    model_config = OPEN

    type: Literal["json_schema"]
    json_schema: ChatJsonSchema


ChatTool = Annotated[ChatFunctionTool | ChatCustomTool, Field(discriminator="type")]
ChatResponseFormat = Annotated[ChatTextFormat | ChatJsonSchemaFormat, Field(discriminator="type")]


class ChatCompletionRequest(OpenAICommon):
    """The body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ChatTool] | None = None
    tool_choice: ToolMode | ChatNamedToolChoice | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ChatResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None
    parallel_tool_calls: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
