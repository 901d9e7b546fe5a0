"""A chat call rendered, sampled and parsed by vLLM's own OpenAI serving layer.

``OpenAIServingChat`` is what ``vllm serve`` runs behind ``/v1/chat/completions``. Per model
family it renders the prompt with the model's chat template (tools and template kwargs
included), converts the sampling parameters (``ChatCompletionRequest.to_sampling_params``),
constrains the output with structured outputs (``response_format``; the tool-call envelope for
a ``required`` or named ``tool_choice``, and a tool's arguments when the tool is ``strict`` or
the engine's ``tool_strict_level`` is ``parameter``), generates, and parses tool calls and
reasoning out of the model's text with the tool-call and reasoning parsers the node config
names, streaming deltas. The engine builds one over its own ``AsyncLLM`` (``VllmChat.build``),
turns each call's ``Call`` into vLLM's ``ChatCompletionRequest`` (``to_vllm_request``) and reads
the server-sent chunks back as ``ChatEvent``s. Nothing here parses model text.

Calls always stream inside (so the first token's time is known, and KV bookkeeping sees the
token ids vLLM returns with ``return_token_ids``); a caller that did not ask for a stream gets
the deltas folded, which is what a streaming client of ``vllm serve`` would get.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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


def to_vllm_request(
    call: Call,
    *,
    model: str,
    request_id: str,
    priority: int,
    max_tokens: int,
    cache_salt: str | None,
) -> dict[str, Any]:
    """The body of vLLM's ``ChatCompletionRequest`` for ``call``: ``chat_fields`` with vLLM's
    own (the limit, the priority, the request id, token ids, the tenant's cache salt)."""
    body: dict[str, Any] = {
        "model": model,
        **chat_fields(call),
        "max_completion_tokens": max_tokens,
        "priority": priority,
        "request_id": request_id,
        "return_token_ids": True,
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
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
        raise _error(error if isinstance(error, Mapping) else data)
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


def _error(error: Mapping[str, Any]) -> Exception:
    """An error response of vLLM's chat layer: the caller's (a 4xx) as ``CallRejected``,
    else a runtime fault."""
    message = str(error.get("message", "vLLM failed the call"))
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 500:
        param = error.get("param")
        return _rejected(message, param if isinstance(param, str) else None)
    return RuntimeError(f"vLLM: {message}")


WINDOW_WORDS = ("maximum context length", "max_model_len")
"""What vLLM's messages say when a prompt, or a prompt and its output limit, passes the
model's window (its ``VLLMValidationError`` texts, vLLM 0.32)."""


def _rejected(message: str, param: str | None) -> CallRejected:
    """The caller's error: ``context_length_exceeded`` when it is about the model's window
    (as OpenAI reports it), else ``invalid_value``."""
    window = any(word in message for word in WINDOW_WORDS)
    return CallRejected("context_length_exceeded" if window else "invalid_value", message, param)


class MeteredClient:
    """The engine client vLLM's serving layer calls: the ``AsyncLLM`` itself, except that
    ``generate`` keeps each request's latest ``RequestOutput.metrics`` (vLLM's own timestamps,
    adapter.py ``engine_times``), which the chat layer's chunks do not carry."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.metrics: dict[str, Any] = {}

    def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """``AsyncLLM.generate``, metered."""
        return self._metered(self._llm.generate(*args, **kwargs))

    async def _metered(self, outputs: Any) -> AsyncIterator[Any]:
        try:
            async for out in outputs:
                metrics = getattr(out, "metrics", None)
                if metrics is not None:
                    self.metrics[str(getattr(out, "request_id", ""))] = metrics
                yield out
        finally:
            with contextlib.suppress(Exception):
                await outputs.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


class VllmChat:
    """vLLM's chat serving layer over one engine (see the module docstring)."""

    def __init__(
        self, serving: Any, model: str, llm: Any = None, special_tokens: Sequence[str] = ()
    ) -> None:
        self._serving = serving
        self._llm = llm
        self.model = model
        self._special = tuple(t for t in special_tokens if t)
        self._metered: MeteredClient | None = None
        if llm is not None and getattr(serving, "engine_client", None) is llm:
            self._metered = MeteredClient(llm)
            serving.engine_client = self._metered

    def metrics_of(self, request: Any) -> Any:
        """vLLM's stats of the request (None if it kept none), forgotten once read."""
        if self._metered is None:
            return None
        return self._metered.metrics.pop(f"chatcmpl-{request.request_id}", None)

    @classmethod
    async def build(
        cls,
        llm: Any,
        model: str,
        model_path: str,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tool_strict_level: str = "parameter",
        chat_template: str | None = None,
        special_tokens: Sequence[str] = (),
    ) -> VllmChat:
        """The serving objects ``vllm serve`` builds (``init_app_state``), for this engine:
        auto tool choice on with ``tool_parser``, ``reasoning_parser``, cached-token details
        and usage in every stream; ``special_tokens`` never reach the reply's text."""
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.renderers.chat_utils import load_chat_template
        from vllm.renderers.online_renderer import OnlineRenderer

        template = load_chat_template(chat_template)
        models = OpenAIServingModels(
            engine_client=llm, base_model_paths=[BaseModelPath(name=model, model_path=model_path)]
        )
        await models.init_static_loras()
        common: dict[str, Any] = {
            "chat_template": template,
            "chat_template_content_format": "auto",
            "trust_request_chat_template": False,
            "enable_auto_tools": tool_parser is not None,
            "tool_parser": tool_parser,
            "tool_strict_level": tool_strict_level,
            "reasoning_parser": reasoning_parser or "",
            "default_chat_template_kwargs": None,
        }
        renderer = OnlineRenderer(
            model_config=llm.model_config,
            renderer=llm.renderer,
            request_logger=None,
            trust_request_mm_kwargs=False,
            exclude_tools_when_tool_choice_none=False,
            log_error_stack=False,
            **common,
        )
        serving = OpenAIServingChat(
            llm,
            models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            enable_prompt_tokens_details=True,
            enable_force_include_usage=True,
            **{k: v for k, v in common.items() if k != "default_chat_template_kwargs"},
        )
        return cls(serving, model, llm, special_tokens)

    def request(self, body: Mapping[str, Any]) -> Any:
        """vLLM's ``ChatCompletionRequest``; its validation failures are the caller's fault."""
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.exceptions import VLLMClientError

        try:
            return ChatCompletionRequest.model_validate(dict(body))
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            message = str(first.get("msg", exc)).removeprefix("Value error, ")
            raise CallRejected("invalid_value", message, param) from exc
        except VLLMClientError as exc:  # vLLM's own validators raise VLLMValidationError
            param = getattr(exc, "parameter", None)
            raise CallRejected(
                "invalid_value", str(exc), param if isinstance(param, str) else None
            ) from exc

    async def stream(self, request: Any, totals: ChatTotals) -> AsyncIterator[ChatChunk]:
        """The call's chunks as vLLM's serving layer streams them. A request vLLM refuses as
        the client's fault (``VLLMClientError``, raised while it renders and checks the
        prompt: a prompt or output limit past the window, a bad parameter) is
        ``CallRejected``, a 400 in the client's dialect, never a runtime fault. Left before
        its end (the client went away, the call was cancelled), the generation is aborted in
        the engine at once, so that it stops using the engine and its KV blocks."""
        from vllm.exceptions import VLLMClientError

        try:
            result = await self._serving.create_chat_completion(request, None)
        except VLLMClientError as exc:
            raise _rejected(str(exc), getattr(exc, "parameter", None)) from exc
        if not hasattr(result, "__aiter__"):
            error = json.loads(result.model_dump_json()).get("error", {})
            raise _error(error)
        done = False
        try:
            async for line in result:
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = parse_chunk(json.loads(payload), totals)
                if chunk is not None:
                    yield self.clean(chunk)
        finally:
            if not done:
                await self._abort(result, request)
                self.metrics_of(request)

    def clean(self, chunk: ChatChunk) -> ChatChunk:
        """The chunk without the tokenizer's special tokens in its text (a special token is
        one token, so it is never split across chunks)."""
        text = chunk.delta.text
        if not self._special or not text:
            return chunk
        for token in self._special:
            text = text.replace(token, "")
        return replace(chunk, delta=replace(chunk.delta, text=text))

    async def _abort(self, result: Any, request: Any) -> None:
        """Close vLLM's stream and abort its request in the engine (vLLM's serving layer names
        it ``chatcmpl-<request_id>``; ``AsyncLLM.abort`` takes that external id)."""
        with contextlib.suppress(Exception):
            await result.aclose()
        if self._llm is not None:
            with contextlib.suppress(Exception):
                await self._llm.abort(f"chatcmpl-{request.request_id}")
