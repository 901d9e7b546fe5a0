"""The request body of ``POST /v1/responses``: validation and OpenAPI schema at once. Input
items are told apart by their ``type`` (an item with a ``role`` and no type is a message); an
item of a type not listed (built-in tools' items, compaction) is accepted and skipped, but for
``item_reference``, which the parser refuses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, StrictBool, Tag

from talaria.proxy.dialects.openai_models import (
    JSON_SCHEMA_DOC,
    OPEN,
    ReasoningEffort,
    ToolMode,
    by_type,
    session_id_field,
)

KNOWN_ITEMS = ("message", "function_call", "function_call_output", "reasoning")


class ResponsesPart(BaseModel):
    """A content part (``input_text``, ``output_text``, ``summary_text``, an image, ...)."""

    model_config = OPEN

    type: str
    text: str = ""


Parts = str | list[ResponsesPart]


class MessageItem(BaseModel):
    """A message (``developer`` read as ``system``)."""

    model_config = OPEN

    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Parts


class FunctionCallItem(BaseModel):
    """A tool call of an earlier turn."""

    model_config = OPEN

    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """A tool call's output: a ``tool`` message."""

    model_config = OPEN

    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: Parts


class ReasoningItem(BaseModel):
    """An earlier turn's reasoning (its content, else its summary)."""

    model_config = OPEN

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ResponsesPart] = []
    content: list[ResponsesPart] = []
    encrypted_content: str | None = None


class OtherItem(BaseModel):
    """Built-in tools' items and the like: accepted and skipped (``item_reference`` is
    refused)."""

    model_config = OPEN

    type: str = Field(
        min_length=1, json_schema_extra={"not": {"enum": [*KNOWN_ITEMS, "item_reference"]}}
    )


def _item_tag(value: Any) -> str:
    """An item's kind: its ``type`` when listed, ``message`` when it has none, else other."""
    if not isinstance(value, dict):
        return str(getattr(value, "type", "other"))
    kind = value.get("type")
    if kind is None:
        return "message"
    return kind if kind in KNOWN_ITEMS else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_tag),
]


class ResponsesFunctionTool(BaseModel):
    """A function the model may call."""

    model_config = OPEN

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description=JSON_SCHEMA_DOC)
    strict: StrictBool | None = None


class NamespaceTool(BaseModel):
    """Codex's group of tools: opened."""

    model_config = OPEN

    type: Literal["namespace"]
    tools: list[ResponsesFunctionTool] | None = None


class BuiltinTool(BaseModel):
    """Built-in tools (web search, ...): left out."""

    model_config = OPEN

    type: str = Field(min_length=1, json_schema_extra={"not": {"enum": ["function", "namespace"]}})


ResponsesTool = Annotated[
    Annotated[ResponsesFunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[BuiltinTool, Tag("builtin")],
    by_type(("function", "namespace"), other="builtin"),
]


class ResponsesNamedChoice(BaseModel):
    """The named function must be called."""

    model_config = OPEN

    type: Literal["function"]
    name: str = Field(min_length=1)


class PlainFormat(BaseModel):
    """Free text, or any JSON object."""

    model_config = OPEN

    type: Literal["text", "json_object"]


class JsonSchemaFormat(BaseModel):
    """A reply that follows a JSON schema."""

    model_config = OPEN

    type: Literal["json_schema"]
    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description=JSON_SCHEMA_DOC)
    strict: StrictBool | None = None


class ResponsesText(BaseModel):
    """The reply's format."""

    model_config = OPEN

    format: Annotated[PlainFormat | JsonSchemaFormat, Field(discriminator="type")] | None = None


class ResponsesReasoning(BaseModel):
    """The reasoning effort asked for."""

    model_config = OPEN

    effort: ReasoningEffort | None = None
    summary: str | None = None


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses``."""

    model_config = OPEN

    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ToolMode | ResponsesNamedChoice | None = None
    parallel_tool_calls: StrictBool = True
    previous_response_id: str | None = None
    store: StrictBool = True
    stream: StrictBool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    text: ResponsesText | None = None
    reasoning: ResponsesReasoning | None = None
    metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = session_id_field()
    user: str | None = None
