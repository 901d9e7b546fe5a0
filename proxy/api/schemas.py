"""Request bodies of the OpenAI-compatible API (only what the gateway reads is typed; unknown
fields are accepted and ignored, as OpenAI-compatible servers do)."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from talaria.proxy.errors import ApiError


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    user: str | None = None
    prompt_cache_key: str | None = None
    litellm_session_id: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str]


class HintRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expected_s: float | None = Field(None, ge=0, description="expected tool time, seconds")
    expected_ms: float | None = Field(None, ge=0, description="the same in milliseconds")
    tool: str | None = Field(None, max_length=200)

    def seconds(self) -> float | None:
        if self.expected_s is not None:
            return self.expected_s
        return None if self.expected_ms is None else self.expected_ms / 1000.0


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any) -> M:
    """Validate ``data``; a failure becomes a 422 in OpenAI's envelope naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(
            422, f"Invalid request: {param}: {first['msg']}", param=param, code="invalid_value"
        ) from exc
