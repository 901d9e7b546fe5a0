"""The LiteLLM ``CustomLLM`` behind ``talaria/<model>`` (imports LiteLLM; see
:mod:`talaria.sdk.litellm` for how to register it).

Each call goes through :class:`talaria.sdk.OpenAI` (``completion``, ``streaming``) or
:class:`talaria.sdk.AsyncOpenAI` (``acompletion``, ``astreaming``) to ``api_base`` (else
``TALARIA_BASE_URL``, else ``http://127.0.0.1:8000/v1``) with ``api_key`` (else
``TALARIA_API_KEY``). LiteLLM's ``optional_params`` (tools, ``tool_choice``, ``max_tokens``,
...) travel as the request body as they are. Streams are turned into LiteLLM's
``GenericStreamingChunk`` dicts: text, one tool-call delta per chunk, and a last chunk with
the finish reason and the usage.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import openai
from litellm import CustomLLM, ModelResponse
from litellm.llms.custom_llm import CustomLLMError

from talaria.sdk.client import AsyncOpenAI, OpenAI
from talaria.sdk.headers import base_url_from_env, has_header, session_headers
from talaria.sdk.sessions import current_session

_SESSION_HEADERS = ("x-talaria-session-id", "x-session-id", "x-litellm-session-id")


def headers_for_call(
    headers: Mapping[str, str] | None, litellm_params: Mapping[str, Any] | None
) -> dict[str, str]:
    """The extra headers of one LiteLLM call: those given (``extra_headers``, or forwarded
    by the LiteLLM proxy); if they name no session and no ``session()`` scope is active, the
    session named by ``litellm_session_id`` or ``metadata``."""
    given = {k: str(v) for k, v in (headers or {}).items()}
    if any(has_header(given, name) for name in _SESSION_HEADERS) or current_session():
        return given
    params = litellm_params or {}
    metadata: Mapping[str, Any] = params.get("metadata") or params.get("litellm_metadata") or {}
    session_id = (
        metadata.get("talaria_session_id")
        or params.get("litellm_session_id")
        or metadata.get("session_id")
    )
    if not session_id:
        return given
    parent = metadata.get("talaria_parent_session_id") or metadata.get("parent_session_id")
    return {**given, **session_headers(str(session_id), str(parent) if parent else None)}


@dataclass
class _Call:
    """One LiteLLM call, as the OpenAI client will send it."""

    model: str
    messages: list[Any]
    base_url: str
    api_key: str
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None

    @classmethod
    def of(cls, model: str, messages: list[Any], kwargs: Mapping[str, Any]) -> _Call:
        body = dict(kwargs.get("optional_params") or {})
        body.pop("stream", None)
        extra = body.pop("extra_body", None)
        if isinstance(extra, Mapping):
            body.update(extra)
        timeout = kwargs.get("timeout")
        return cls(
            model=model,
            messages=list(messages),
            base_url=kwargs.get("api_base") or base_url_from_env(),
            api_key=kwargs.get("api_key") or os.environ.get("TALARIA_API_KEY", "talaria"),
            body=body,
            headers=headers_for_call(kwargs.get("headers"), kwargs.get("litellm_params")),
            timeout=float(timeout) if isinstance(timeout, int | float) else None,
        )

    def create_kwargs(self, *, stream: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages,
            "extra_body": self.body,
            "extra_headers": self.headers,
        }
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        if stream:
            kwargs["stream"] = True
            kwargs["extra_body"] = {"stream_options": {"include_usage": True}, **self.body}
        return kwargs


def _error(exc: openai.APIError) -> CustomLLMError:
    status = exc.status_code if isinstance(exc, openai.APIStatusError) else 503
    return CustomLLMError(status_code=status, message=exc.message)


def _model_response(reply: Any) -> Any:
    return ModelResponse(**reply.model_dump())


def _generic(
    text: str = "", tool: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None
) -> dict[str, Any]:
    return {
        "text": text,
        "tool_use": tool,
        "is_finished": finish is not None,
        "finish_reason": finish or "",
        "usage": usage,
        "index": 0,
    }


class _ChunkTranslator:
    """OpenAI ``ChatCompletionChunk`` objects in, ``GenericStreamingChunk`` dicts out; the
    finish is held back and sent last, with the usage."""

    def __init__(self) -> None:
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: Any) -> Iterator[dict[str, Any]]:
        if chunk.usage is not None:
            self.usage = chunk.usage.model_dump(exclude_none=True)
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                yield _generic(text=delta.content)
            for tc in delta.tool_calls or []:
                function = tc.function
                yield _generic(
                    tool={
                        "id": tc.id,
                        "type": "function",
                        "function": {
                            "name": function.name if function else None,
                            "arguments": (function.arguments if function else None) or "",
                        },
                        "index": tc.index,
                    }
                )
            if choice.finish_reason:
                self.finish = choice.finish_reason

    def last(self) -> dict[str, Any]:
        return _generic(finish=self.finish or "stop", usage=self.usage)


def _sync_chunks(stream: Any) -> Iterator[dict[str, Any]]:
    translator = _ChunkTranslator()
    with stream:
        for chunk in stream:
            yield from translator.feed(chunk)
    yield translator.last()


async def _async_chunks(stream: Any) -> AsyncIterator[dict[str, Any]]:
    translator = _ChunkTranslator()
    async with stream:
        async for chunk in stream:
            for item in translator.feed(chunk):
                yield item
    yield translator.last()


class TalariaLLM(CustomLLM):  # type: ignore[misc]  # LiteLLM's types are not followed
    """LiteLLM provider ``talaria/<model>``: chat completions through Talaria, in sessions."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], OpenAI] = {}
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, str], AsyncOpenAI]
        ] = weakref.WeakKeyDictionary()

    def _client(self, call: _Call) -> OpenAI:
        key = (call.base_url, call.api_key)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = OpenAI(base_url=call.base_url, api_key=call.api_key)
            return self._clients[key]

    def _aclient(self, call: _Call) -> AsyncOpenAI:
        """One async client per event loop (its connections belong to that loop)."""
        key = (call.base_url, call.api_key)
        loop = asyncio.get_running_loop()
        with self._lock:
            clients = self._async.setdefault(loop, {})
            if key not in clients:
                clients[key] = AsyncOpenAI(base_url=call.base_url, api_key=call.api_key)
            return clients[key]

    def completion(self, model: str, messages: list[Any], *_: Any, **kwargs: Any) -> Any:
        """One non-streaming chat completion, as LiteLLM's ``ModelResponse``."""
        call = _Call.of(model, messages, kwargs)
        try:
            reply = self._client(call).chat.completions.create(**call.create_kwargs(stream=False))
        except openai.APIError as exc:
            raise _error(exc) from exc
        return _model_response(reply)

    def streaming(
        self, model: str, messages: list[Any], *_: Any, **kwargs: Any
    ) -> Iterator[dict[str, Any]]:
        """One streaming chat completion, as LiteLLM's ``GenericStreamingChunk`` dicts."""
        call = _Call.of(model, messages, kwargs)
        try:
            stream = self._client(call).chat.completions.create(**call.create_kwargs(stream=True))
        except openai.APIError as exc:
            raise _error(exc) from exc
        return _sync_chunks(stream)

    async def acompletion(self, model: str, messages: list[Any], *_: Any, **kwargs: Any) -> Any:
        """The async :meth:`completion` (one client per event loop)."""
        call = _Call.of(model, messages, kwargs)
        client = self._aclient(call)
        try:
            reply = await client.chat.completions.create(**call.create_kwargs(stream=False))
        except openai.APIError as exc:
            raise _error(exc) from exc
        return _model_response(reply)

    async def astreaming(
        self, model: str, messages: list[Any], *_: Any, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """The async :meth:`streaming` (one client per event loop)."""
        call = _Call.of(model, messages, kwargs)
        client = self._aclient(call)
        try:
            stream = await client.chat.completions.create(**call.create_kwargs(stream=True))
        except openai.APIError as exc:
            raise _error(exc) from exc
        async for item in _async_chunks(stream):
            yield item
