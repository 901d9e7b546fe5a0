"""HTTP to one OpenAI-compatible server (``vllm serve``, SGLang, llama.cpp's server): the
model list, a streamed chat completion built from a ``Call``, and the plain POST / GET the
sleep endpoints need (sleep.py).

The chat request is what an OpenAI client would send: messages, tools and ``tool_choice``,
``response_format``, the caller's sampling parameters where given (so the server's defaults and
the model's generation config apply to the rest), ``logprobs``, the output limit, and always
``stream: true`` with ``stream_options.include_usage`` (the first token's time is known, and the
last chunk's usage carries ``prompt_tokens_details.cached_tokens``). Its chunks are read by the
in-process vLLM engine's ``parse_chunk`` (runtime/engines/vllm/chat.py), so both engines emit
the same deltas (text, ``reasoning`` or ``reasoning_content``, tool-call fragments, logprobs).

Faults: the server unreachable, a 5xx, an auth or rate-limit refusal, a timeout or a stream
that ends before its ``[DONE]`` is ``UpstreamUnavailable`` (the node reports it to the proxy,
which answers 503); a 400/413/422 is the caller's (``CallRejected``: a context overflow is
``context_length_exceeded``, as vLLM's own engine says it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx

from talaria.core.calls import Call
from talaria.core.types import CallRejected
from talaria.runtime.engines.upstream.options import UpstreamOptions
from talaria.runtime.engines.vllm.chat import chat_fields

CONNECT_TIMEOUT_S = 10.0
CALLERS_FAULT = frozenset({400, 413, 422})
"""Upstream statuses that are the caller's fault (any other 4xx is the runtime's: a wrong key
or model name, or a server that sheds load)."""
WINDOW_WORDS = ("context length", "context_length", "context size", "max_model_len",
                "maximum context")  # fmt: skip
"""What servers' messages say about a prompt past the model's window (vLLM: "maximum context
length", "max_model_len"; SGLang: "longer than the model's context length"; llama.cpp:
"exceeds the available context size")."""


class UpstreamUnavailable(RuntimeError):
    """The upstream server did not serve (down, 5xx, refused the runtime, timed out, or its
    stream broke off): the runtime's fault, retryable elsewhere."""


def served_window(entry: Mapping[str, Any]) -> int | None:
    """The context window a server reports for one model of its ``GET /v1/models``: vLLM's
    and SGLang's ``max_model_len``, else llama.cpp's ``meta.n_ctx`` (what one of its slots
    holds: ``-c`` over ``-np``; ``n_ctx_train`` is the model's, not the server's); None when
    it reports neither (docs/sources.md §13)."""
    meta = entry.get("meta")
    llama_cpp = meta.get("n_ctx") if isinstance(meta, dict) else None
    for window in (entry.get("max_model_len"), llama_cpp):
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            return window
    return None


def chat_body(call: Call, model: str, max_tokens: int | None) -> dict[str, Any]:
    """The chat completion request for ``call`` (vLLM's ``chat_fields``, see the module
    docstring); ``max_tokens``: None leaves the limit to the server (the rest of the model's
    window)."""
    body: dict[str, Any] = {"model": model, **chat_fields(call)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def _message(raw: bytes) -> str:
    """The error message of a server's error body (OpenAI's ``{"error": {"message"}}``,
    vLLM's older ``{"message"}``, FastAPI's ``{"detail"}``), else its text."""
    text = raw.decode(errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:500] or "(empty body)"
    if isinstance(doc, Mapping):
        error = doc.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if doc.get(key):
                return str(doc[key])
    return text[:500]


def refusal(status: int, message: str, url: str) -> Exception:
    """An upstream error status as the runtime reports it (see the module docstring)."""
    if status in CALLERS_FAULT:
        low = message.lower()
        window = any(word in low for word in WINDOW_WORDS)
        return CallRejected("context_length_exceeded" if window else "invalid_value", message)
    return UpstreamUnavailable(f"upstream {url} answered {status}: {message}")


class UpstreamClient:
    """One server's HTTP client (``httpx.AsyncClient``, made on first use in the loop)."""

    def __init__(self, options: UpstreamOptions) -> None:
        self._opt = options
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        """The server's OpenAI base URL (``…/v1``)."""
        return self._opt.url

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {}
            if self._opt.api_key:
                headers["Authorization"] = f"Bearer {self._opt.api_key}"
            timeout = httpx.Timeout(self._opt.timeout_s, connect=CONNECT_TIMEOUT_S)
            self._client = httpx.AsyncClient(headers=headers, timeout=timeout)
        return self._client

    async def close(self) -> None:
        """Close its connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None, root: bool = False,
    ) -> Any:  # fmt: skip
        """``method path`` on the server (``root``: under its root, not ``/v1``); its JSON (or
        text) answer. Any failure is ``UpstreamUnavailable`` naming the URL."""
        url = (self._opt.base if root else self._opt.url) + path
        try:
            answer = await self._http().request(method, url, params=params, json=body)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"upstream {url}: {type(exc).__name__}: {exc}") from exc
        if answer.status_code >= 300:
            message = _message(answer.content)
            raise UpstreamUnavailable(f"upstream {url} answered {answer.status_code}: {message}")
        try:
            return answer.json()
        except ValueError:
            return answer.text

    async def models(self) -> list[Mapping[str, Any]]:
        """``GET /v1/models``'s entries."""
        doc = await self.request("GET", "/models")
        data = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(data, list):
            raise UpstreamUnavailable(f"upstream {self.url}/models: not a model list: {doc!r}")
        return [m for m in data if isinstance(m, Mapping)]

    async def stream_chat(self, body: Mapping[str, Any]) -> AsyncGenerator[Mapping[str, Any], None]:
        """The chat completion's chunks, parsed, up to ``[DONE]``. Closing this generator
        early closes the HTTP stream (the server then aborts the request)."""
        url = self._opt.url + "/chat/completions"
        done = False
        try:
            async with self._http().stream("POST", url, json=body) as answer:
                if answer.status_code >= 300:
                    raise refusal(answer.status_code, _message(await answer.aread()), url)
                async for line in answer.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:") :].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError as exc:
                        raise UpstreamUnavailable(f"upstream {url}: bad chunk {payload!r}") from exc
                    if isinstance(chunk, Mapping):
                        yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"upstream {url}: {type(exc).__name__}: {exc}") from exc
        if not done:
            raise UpstreamUnavailable(f"upstream {url}: the stream ended before [DONE]")
