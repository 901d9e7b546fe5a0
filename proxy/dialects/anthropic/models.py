"""The request bodies of ``POST /v1/messages`` and ``/v1/messages/count_tokens``: validation
and OpenAPI schema at once. Content blocks are told apart by their ``type``; a block of a type
not listed (server-tool results and the like) is accepted and left out of the prompt."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool, Tag, field_validator

from talaria.proxy.dialects.openai_models import JSON_SCHEMA_DOC, OPEN, by_type

MIN_THINKING_BUDGET = 1024
"""Anthropic's least ``thinking.budget_tokens``."""


class TextBlock(BaseModel):
    """A text block."""

    model_config = OPEN

    type: Literal["text"]
    text: str


class Base64Source(BaseModel):
    """An image's bytes, base64-encoded."""

    model_config = OPEN

    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(BaseModel):
    """An image's address."""

    model_config = OPEN

    type: Literal["url"]
    url: str


class ImageBlock(BaseModel):
    """An image: passed to the model as an ``image_url`` part."""

    model_config = OPEN

    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]


class DocumentSource(BaseModel):
    """A document's source; its ``content`` (text or text blocks) is read."""

    model_config = OPEN

    type: str
    content: str | list[TextBlock] | None = None


class DocumentBlock(BaseModel):
    """A document: its text content joins the user's text."""

    model_config = OPEN

    type: Literal["document"]
    source: DocumentSource | None = None


ResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(BaseModel):
    """The result of a tool call: a ``tool`` message (prefixed when ``is_error``)."""

    model_config = OPEN

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultPart] | None = None
    is_error: StrictBool = False


class ToolUseBlock(BaseModel):
    """A tool call of an earlier assistant turn."""

    model_config = OPEN

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ThinkingBlock(BaseModel):
    """An earlier turn's reasoning: the message's ``reasoning_content``."""

    model_config = OPEN

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    """Reasoning the client cannot read: left out of the prompt."""

    model_config = OPEN

    type: Literal["redacted_thinking"]
    data: str


KNOWN_BLOCKS = (
    "text",
    "image",
    "document",
    "tool_result",
    "tool_use",
    "thinking",
    "redacted_thinking",
)


class OtherBlock(BaseModel):
    """Server-tool and other blocks: accepted and left out of the prompt."""

    model_config = OPEN

    type: str = Field(min_length=1, json_schema_extra={"not": {"enum": list(KNOWN_BLOCKS)}})


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[DocumentBlock, Tag("document")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[OtherBlock, Tag("other")],
    by_type(KNOWN_BLOCKS),
]


class MessageIn(BaseModel):
    """A turn of the conversation."""

    model_config = OPEN

    role: Literal["user", "assistant", "system"]
    """``system`` mid-conversation: Claude Code sends its environment notes so."""
    content: str | list[Block]


class ToolIn(BaseModel):
    """A custom tool (with ``input_schema``) or a server tool (left out)."""

    model_config = OPEN

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = Field(None, description=JSON_SCHEMA_DOC)
    type: str | None = None


class ModeChoice(BaseModel):
    """``auto``, ``any`` (a tool call is required) or ``none``."""

    model_config = OPEN

    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: StrictBool | None = None


class ToolNamedChoice(BaseModel):
    """The named tool must be called."""

    model_config = OPEN

    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: StrictBool | None = None


AnthropicToolChoice = Annotated[
    Annotated[ModeChoice, Tag("mode")] | Annotated[ToolNamedChoice, Tag("tool")],
    by_type(("tool",), other="mode"),
]


class ThinkingEnabled(BaseModel):
    """Reasoning asked for, with a token budget."""

    model_config = OPEN

    type: Literal["enabled"]
    budget_tokens: int = Field(
        json_schema_extra={"minimum": MIN_THINKING_BUDGET},
        description="less than max_tokens (but with interleaved thinking)",
    )

    @field_validator("budget_tokens", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> int:
        """A whole number (an integer, or a float without a fraction: JSON schema's integer;
        not a boolean or a string) of at least 1024, as Anthropic takes it."""
        whole = not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        )
        if not whole or value < MIN_THINKING_BUDGET:
            raise ValueError(
                f"thinking.budget_tokens must be an integer of at least {MIN_THINKING_BUDGET}"
            )
        return int(value)


class ThinkingOther(BaseModel):
    """Reasoning off, or at the model's discretion."""

    model_config = OPEN

    type: Literal["disabled", "adaptive"]


Thinking = Annotated[
    Annotated[ThinkingEnabled, Tag("enabled")] | Annotated[ThinkingOther, Tag("other")],
    by_type(("enabled",)),
]


class Metadata(BaseModel):
    """The request's metadata: ``user_id`` may name the session."""

    model_config = OPEN

    user_id: str | None = Field(
        None, description="Claude Code puts its session id here (docs/proxy.md)"
    )


class CountTokensRequest(BaseModel):
    """A Messages request without ``max_tokens``: what ``count_tokens`` validates (as
    Anthropic's does, so that a body it accepts is one ``/v1/messages`` would take)."""

    model_config = OPEN

    model: str = Field(min_length=1)
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: StrictBool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolIn] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None


class MessagesRequest(CountTokensRequest):
    """The body of ``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
