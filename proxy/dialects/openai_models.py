"""Request fields the OpenAI dialects share (chat completions, text completions, Responses):
sampling, limits, reasoning effort, session-id fields, function tools and tool choice.

Each model here is validation and OpenAPI schema at once. Extra fields are allowed everywhere
(SDKs add their own). A session id field is checked by the session identity
(proxy/sessions/identity.py, a 400 ``invalid_session``), not here: its pattern is stated in
the schema only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool

from talaria.core.calls import Sampling, ToolChoice, ToolSpec
from talaria.proxy.dialects.common import invalid
from talaria.proxy.sessions.identity import MAX_SESSION_ID_CHARS

OPEN = ConfigDict(extra="allow")

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

SESSION_ID_SCHEMA: dict[str, Any] = {
    "pattern": rf"^[\x20-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}$",
    "description": "a session id: 1 to 200 printable ASCII characters (docs/proxy.md, Sessions)",
}


def session_id_field() -> Any:
    """An optional session id (``prompt_cache_key``, ``litellm_session_id``)."""
    return Field(None, json_schema_extra=SESSION_ID_SCHEMA)


JSON_SCHEMA_DOC = "a JSON schema"


def type_of(value: Any) -> Any:
    """A union member's ``type``, from the raw object or a model."""
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


def by_type(known: tuple[str, ...], other: str = "other") -> Discriminator:
    """Tells a union's members apart by ``type``: a ``known`` one is its own tag, any other
    (or none) is ``other``."""
    return Discriminator(lambda value: kind if (kind := type_of(value)) in known else other)


class FunctionDef(BaseModel):
    """A function a tool offers: its name, description, parameters' JSON schema, strictness."""

    model_config = OPEN

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description=JSON_SCHEMA_DOC)
    strict: StrictBool | None = None

    def spec(self) -> ToolSpec:
        """The tool as the normalized call holds it."""
        return ToolSpec(self.name, self.description or "", dict(self.parameters or {}), self.strict)


class StreamOptions(BaseModel):
    """Streaming options: ``include_usage`` adds a last chunk with the usage."""

    model_config = OPEN

    include_usage: StrictBool = False


class OpenAICommon(BaseModel):
    """Fields chat and text completions share."""

    model_config = OPEN

    model: str = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    ignore_eos: StrictBool = False
    """vLLM's extension (core/calls.py ``Sampling.ignore_eos``)."""
    user: str | None = None
    prompt_cache_key: str | None = session_id_field()
    litellm_session_id: str | None = session_id_field()

    @property
    def include_usage(self) -> bool:
        """``stream_options.include_usage``: a last chunk with the usage."""
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self, logprobs: bool, top_logprobs: int | None, fmt: Any) -> Sampling:
        """The sampling parameters, with the dialect's ``logprobs`` and response format."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            response_format=fmt,
            ignore_eos=self.ignore_eos,
        )


ToolMode = Literal["auto", "none", "required"]


def tool_choice(
    mode: ToolMode | None, named: str | None, tools: tuple[ToolSpec, ...]
) -> ToolChoice:
    """A mode, or the function ``named`` (which must be among ``tools``); none: auto."""
    if named is not None:
        if named not in {t.name for t in tools}:
            raise invalid(
                f"tool_choice names `{named}`, which is not among the tools.", "tool_choice"
            )
        return ToolChoice("named", named)
    return ToolChoice(mode or "auto")
