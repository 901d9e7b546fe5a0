"""The request body of ``POST /v1/completions``: validation and OpenAPI schema at once."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from talaria.proxy.dialects.openai_models import OpenAICommon

OnePrompt = Annotated[list[str], Field(json_schema_extra={"minItems": 1, "maxItems": 1})]
"""A list of prompts holds one (the parser refuses others with a 400 that says so)."""


class CompletionRequest(OpenAICommon):
    """The body of ``POST /v1/completions``."""

    prompt: str | OnePrompt = Field(description="one prompt per request")
    logprobs: int | None = Field(None, ge=0, le=5)
