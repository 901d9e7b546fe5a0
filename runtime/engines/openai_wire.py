"""The OpenAI chat-completions wire, as both engines that speak it read and write it: the vLLM
engine through vLLM's own serving layer (vllm/chat.py) and the upstream engine over HTTP
(upstream/). ``chat_fields`` writes a ``Call`` as the fields any server takes (each engine adds
its own); ``parse_chunk`` reads one streamed chunk (its delta, token ids, and the usage the
last one carries) into ``ChatChunk`` and ``ChatTotals``; an error chunk is ``CallRejected`` for
the caller's fault (``rejected``: ``context_length_exceeded`` when it is about the model's
window), else a runtime fault (``wire_error``). Nothing here imports vLLM or an HTTP client."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from talaria.core.calls import (
    Call,
    OutputDelta,
    Sampling,
    TokenLogprob,
    ToolCallDelta,
    ToolChoice,
)
from talaria.core.types import CallRejected


@dataclass(frozen=True)
class ChatChunk:
    """What one streamed chunk carries."""

    delta: OutputDelta
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None


@dataclass
class ChatTotals:
    """What the stream says about the whole call."""

    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def tool_choice_doc(choice: ToolChoice) -> Any:
    """The tool choice as OpenAI writes it: a mode, or the named function."""
    if choice.mode == "named":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def decoding_params(s: Sampling) -> dict[str, Any]:
    """The caller's decoding parameters that vLLM takes by these names on every path (chat
    calls and calls sent as token ids), only those given, so vLLM's defaults and the model's
    generation config apply to the rest."""
    given = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    }
    return {k: v for k, v in given.items() if v is not None}


def chat_fields(call: Call) -> dict[str, Any]:
    """The OpenAI chat completion fields of ``call`` that any server takes, streamed with usage:
    its messages, tools, the caller's sampling parameters only where given (so the server's
    defaults and the model's generation config apply to the rest), response format, reasoning
    effort, template kwargs, stop, logprobs, ``ignore_eos``. ``to_vllm_request`` and the
    upstream engine's ``chat_body`` (runtime/engines/upstream/client.py) add their own."""
    s = call.sampling
    body: dict[str, Any] = {
        "messages": [dict(m) for m in call.messages or ()],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if call.tools:
        body["tools"] = [t.to_openai() for t in call.tools]
        body["tool_choice"] = tool_choice_doc(call.tool_choice)
        if call.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = call.parallel_tool_calls
    body.update(decoding_params(s))
    optional = {
        "top_logprobs": s.top_logprobs,
        "response_format": dict(s.response_format) if s.response_format else None,
        "reasoning_effort": call.reasoning_effort,
        "chat_template_kwargs": dict(call.template_kwargs) if call.template_kwargs else None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if s.stop:
        body["stop"] = list(s.stop)
    if s.logprobs:
        body["logprobs"] = True
    if s.ignore_eos:
        body["ignore_eos"] = True
    return body


def _logprobs(doc: Any) -> tuple[TokenLogprob, ...]:
    content = (doc or {}).get("content") or ()
    return tuple(
        TokenLogprob(
            str(entry.get("token", "")),
            float(entry.get("logprob", 0.0)),
            tuple(
                (str(t.get("token", "")), float(t.get("logprob", 0.0)))
                for t in entry.get("top_logprobs") or ()
            ),
        )
        for entry in content
    )


def parse_chunk(data: Mapping[str, Any], totals: ChatTotals) -> ChatChunk | None:
    """One chunk of vLLM's stream: its delta (content, ``reasoning``, tool-call fragments,
    logprobs) and token ids; the first chunk's ``prompt_token_ids`` and the last one's usage go
    to ``totals``. An error chunk raises (``CallRejected`` for a 4xx)."""
    error = data.get("error") if "error" in data else None
    if error is not None or data.get("object") == "error":
        raise wire_error(error if isinstance(error, Mapping) else data)
    prompt_ids = data.get("prompt_token_ids")
    if prompt_ids:
        totals.prompt_token_ids = [int(i) for i in prompt_ids]
    usage = data.get("usage")
    choices = data.get("choices") or ()
    if usage and not choices:
        totals.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        totals.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        totals.cached_tokens = int(details.get("cached_tokens") or 0)
    if not choices:
        return None
    choice = choices[0]
    delta = choice.get("delta") or {}
    calls = tuple(
        ToolCallDelta(
            int(part.get("index", 0)),
            part.get("id"),
            (part.get("function") or {}).get("name"),
            (part.get("function") or {}).get("arguments") or "",
        )
        for part in delta.get("tool_calls") or ()
    )
    reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
    out = OutputDelta(
        delta.get("content") or "", reasoning, calls, _logprobs(choice.get("logprobs"))
    )
    ids = tuple(int(i) for i in choice.get("token_ids") or ())
    return ChatChunk(out, ids, choice.get("finish_reason"))


def wire_error(error: Mapping[str, Any]) -> Exception:
    """An error response of vLLM's chat layer: the caller's (a 4xx) as ``CallRejected``,
    else a runtime fault."""
    message = str(error.get("message", "vLLM failed the call"))
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 500:
        param = error.get("param")
        return rejected(message, param if isinstance(param, str) else None)
    return RuntimeError(f"vLLM: {message}")


WINDOW_WORDS = ("maximum context length", "max_model_len")
"""What vLLM's messages say when a prompt, or a prompt and its output limit, passes the
model's window (its ``VLLMValidationError`` texts, vLLM 0.32)."""


def rejected(message: str, param: str | None) -> CallRejected:
    """The caller's error: ``context_length_exceeded`` when it is about the model's window
    (as OpenAI reports it), else ``invalid_value``."""
    window = any(word in message for word in WINDOW_WORDS)
    return CallRejected("context_length_exceeded" if window else "invalid_value", message, param)
