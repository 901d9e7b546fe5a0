"""OpenAI text completions, the request: ``POST /v1/completions`` (one prompt per request).

Request → ``Call`` with a text ``prompt`` and the shared sampling fields. A text prompt is not a
conversation, so without an explicit session id each call is a session of its own.
"""

from __future__ import annotations

from typing import Any

from talaria.core.calls import Call
from talaria.proxy.dialects.common import invalid, parse
from talaria.proxy.dialects.completions.models import CompletionRequest


def parse_completion(raw: Any) -> Call:
    """The request as a ``Call`` (422 for a body its model refuses)."""
    return completion_call(parse(CompletionRequest, raw))


def completion_call(body: CompletionRequest) -> Call:
    """The validated request as a ``Call``; 400 for more than one prompt."""
    if isinstance(body.prompt, list) and len(body.prompt) != 1:
        raise invalid("Only one prompt per request is supported.", "prompt")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    logprobs = body.logprobs is not None
    return Call(
        model=body.model,
        prompt=prompt,
        sampling=body.sampling(logprobs, body.logprobs, None),
        max_output_tokens=body.max_tokens,
        stream=body.stream,
    )
