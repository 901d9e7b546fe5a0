"""HTTP to one OpenAI-compatible server (``vllm serve``, SGLang, llama.cpp's server): the
model list, a streamed chat completion built from a ``Call``, and the plain POST / GET the
sleep endpoints need (sleep.py).

The chat request is what an OpenAI client would send: messages, tools and ``tool_choice``,
``response_format``, the caller's sampling parameters where given (so the server's defaults and
the model's generation config apply to the rest), ``logprobs``, the output limit, and always
``stream: true`` with ``stream_options.include_usage`` (the first token's time is known, and the
last chunk's usage carries ``prompt_tokens_details.cached_tokens``). Its body and its chunks
are the OpenAI wire both engines share (runtime/engines/openai_wire.py), so both engines emit
the same deltas (text, ``reasoning`` or ``reasoning_content``, tool-call fragments, logprobs).
Every answer is read within the bounds of reading.py (bytes, line length, total time).

Faults: the server unreachable, a 5xx, an auth or rate-limit refusal, a timeout, a stream
that ends before its ``[DONE]`` or an answer past a read bound (reading.py) is
``UpstreamUnavailable`` (the node reports it to the proxy, which answers 503); a 400/413/422
is the caller's (``CallRejected``: a context overflow is ``context_length_exceeded``, as
vLLM's own engine says it).

What the server sends never reaches an error message, with one exception. A fault names the
URL and the status or the bound passed (the server's message goes to the runtime's log,
at most ``LOGGED_CHARS``): an answer from a server that is not an inference server (a
metrics page, another service's JSON) is not reflected to whoever placed or called it. The
exception is a request the server refuses as the caller's (400, 413, 422): the message of
its JSON error (OpenAI's ``error.message``, vLLM's ``message``, FastAPI's ``detail``; at
most ``MESSAGE_CHARS`` characters) is the caller's answer, as the in-process vLLM engine
gives it (the window it passed, the parameter it got wrong); any other body is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import replace
from typing import Any

import httpx

from talaria.core.calls import Call
from talaria.core.types import CallRejected
from talaria.runtime.engines.openai_wire import chat_fields
from talaria.runtime.engines.upstream.options import UpstreamOptions
from talaria.runtime.engines.upstream.reading import (
    LineSplitter,
    ReadBounds,
    UpstreamUnavailable,
    UpstreamUnreachable,
    raw_chunks,
    read_body,
    read_head,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
CALLERS_FAULT = frozenset({400, 413, 422})
"""Upstream statuses that are the caller's fault (any other 4xx is the runtime's: a wrong key
or model name, or a server that sheds load)."""
WINDOW_WORDS = ("context length", "context_length", "context size", "max_model_len",
                "maximum context")  # fmt: skip
"""What servers' messages say about a prompt past the model's window (vLLM: "maximum context
length", "max_model_len"; SGLang: "longer than the model's context length"; llama.cpp:
"exceeds the available context size")."""
ERROR_HEAD_BYTES = 8192
"""Bytes of an error answer read for its message (the rest is never read)."""
MESSAGE_CHARS = 300
"""Characters of a server's message about the caller's request passed to the caller."""
LOGGED_CHARS = 300
"""Characters of a server's error message written to the runtime's log."""


MAX_WINDOW_TOKENS = 1 << 24
"""The largest context window taken from a server's model list (16.8M tokens, above any
model's today: Llama 4 Scout's is 10M). A call's output limit, and so its reply's byte bound,
follow the window; a larger figure is not a window (give ``context_window``)."""


def served_window(entry: Mapping[str, Any]) -> int | None:
    """The context window a server reports for one model of its ``GET /v1/models``: vLLM's
    and SGLang's ``max_model_len``, else llama.cpp's ``meta.n_ctx`` (what one of its slots
    holds: ``-c`` over ``-np``; ``n_ctx_train`` is the model's, not the server's); None when
    it reports neither, or nothing in (0, ``MAX_WINDOW_TOKENS``] (docs/sources.md §13)."""
    meta = entry.get("meta")
    llama_cpp = meta.get("n_ctx") if isinstance(meta, dict) else None
    for window in (entry.get("max_model_len"), llama_cpp):
        if not isinstance(window, int) or isinstance(window, bool):
            continue
        if 0 < window <= MAX_WINDOW_TOKENS:
            return window
    return None


def chat_body(
    call: Call,
    model: str,
    max_tokens: int | None,
    cache_salt: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The chat completion request for ``call`` (vLLM's ``chat_fields``, see the module
    docstring); ``max_tokens``: None leaves the limit to the server (the rest of the model's
    window); ``cache_salt``: the tenant's prefix-cache salt (vLLM's ``cache_salt``), sent only
    when given; ``priority``: the server's ``priority`` field (runtime/engines/priorities.py),
    sent only when given."""
    body: dict[str, Any] = {"model": model, **chat_fields(call)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if priority is not None:
        body["priority"] = priority
    return body


def error_message(raw: bytes) -> str | None:
    """The message of a JSON error body (OpenAI's ``{"error": {"message"}}``, vLLM's older
    ``{"message"}``, FastAPI's ``{"detail"}``), printable characters only, at most
    ``MESSAGE_CHARS``; None for a body that is not a JSON error."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, Mapping):
        return None
    error = doc.get("error")
    found: Any = None
    if isinstance(error, Mapping) and error.get("message"):
        found = error["message"]
    else:
        found = next((doc[k] for k in ("message", "detail", "error") if doc.get(k)), None)
    if not isinstance(found, str):
        return None
    text = "".join(c if c.isprintable() else " " for c in found).strip()
    return text[:MESSAGE_CHARS] or None


def refusal(status: int, message: str | None, url: str) -> Exception:
    """An upstream error status as the runtime reports it (see the module docstring): the
    caller's ``CallRejected`` with the server's message, or an ``UpstreamUnavailable`` that
    names the status only (the message goes to the log)."""
    if status in CALLERS_FAULT:
        text = message or f"the model server refused the request ({status})"
        window = any(word in text.lower() for word in WINDOW_WORDS)
        return CallRejected("context_length_exceeded" if window else "invalid_value", text)
    if message:
        log.warning("upstream %s answered %d: %s", url, status, message[:LOGGED_CHARS])
    return UpstreamUnavailable(f"upstream {url} answered {status}")


def unavailable(url: str, exc: httpx.HTTPError) -> UpstreamUnavailable:
    """What a transport failure of a request to ``url`` is: ``UpstreamUnreachable`` when no
    connection was made (refused, unresolvable, timed out connecting), else
    ``UpstreamUnavailable``; the message names the URL and the error's kind only."""
    unreachable = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    kind = UpstreamUnreachable if unreachable else UpstreamUnavailable
    return kind(f"upstream {url}: {type(exc).__name__}")


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
            headers = {"Accept-Encoding": "identity"}  # reading.py: no compressed answers
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

    async def _send(self, request: httpx.Request, bounds: ReadBounds) -> httpx.Response:
        """``request`` sent, its status and headers read before the deadline; the body is
        the caller's to read (and the answer its to close)."""
        try:
            async with asyncio.timeout_at(bounds.deadline):
                return await self._http().send(request, stream=True)
        except TimeoutError as exc:
            raise bounds.too_slow() from exc

    async def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None, root: bool = False,
        time_option: str = "timeout_s",
    ) -> Any:  # fmt: skip
        """``method path`` on the server (``root``: under its root, not ``/v1``); its JSON (or
        text) answer, read within ``models_max_bytes`` and the seconds of ``time_option``
        (``timeout_s``; ``models_timeout_s`` for the model list). Any failure is
        ``UpstreamUnavailable`` naming the URL and the status or bound, not the answer."""
        url = (self._opt.base if root else self._opt.url) + path
        seconds = float(getattr(self._opt, time_option))
        bounds = ReadBounds.within(
            url, self._opt.models_max_bytes, "models_max_bytes", seconds, time_option
        )
        try:
            request = self._http().build_request(method, url, params=params, json=body)
            answer = await self._send(request, bounds)
            try:
                if answer.status_code >= 300:
                    head = await read_head(answer, replace(bounds, max_bytes=ERROR_HEAD_BYTES))
                    raise refusal(answer.status_code, error_message(head), url)
                raw = await read_body(answer, bounds)
            finally:
                await answer.aclose()
        except httpx.HTTPError as exc:
            raise unavailable(url, exc) from exc
        except CallRejected as exc:  # a 4xx of a plain request is not a caller's
            raise UpstreamUnavailable(f"upstream {url}: refused ({exc.code})") from exc
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    async def models(self) -> list[Mapping[str, Any]]:
        """``GET /v1/models``'s entries (within ``models_max_bytes`` and
        ``models_timeout_s``)."""
        doc = await self.request("GET", "/models", time_option="models_timeout_s")
        data = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(data, list):
            raise UpstreamUnavailable(
                f"upstream {self.url}/models: not a model list (no 'data' array)"
            )
        return [m for m in data if isinstance(m, Mapping)]

    async def stream_chat(
        self, body: bytes, max_bytes: int
    ) -> AsyncGenerator[Mapping[str, Any], None]:
        """The chat completion's chunks for the JSON ``body``, parsed, up to ``[DONE]``;
        the stream within ``max_bytes`` (the call's ``reply_max_bytes``), each line within
        ``line_max_bytes``, the whole within ``call_timeout_s``. Closing this generator early
        closes the HTTP stream (the server then aborts the request)."""
        url = self._opt.url + "/chat/completions"
        opt = self._opt
        bounds = ReadBounds.within(
            url, max_bytes, "reply_bytes_per_token", opt.call_timeout_s, "call_timeout_s"
        )
        done = False
        try:
            request = self._http().build_request(
                "POST", url, content=body, headers={"Content-Type": "application/json"}
            )
            answer = await self._send(request, bounds)
            try:
                if answer.status_code >= 300:
                    head = await read_head(answer, replace(bounds, max_bytes=ERROR_HEAD_BYTES))
                    raise refusal(answer.status_code, error_message(head), url)
                lines = LineSplitter(opt.line_max_bytes, url)
                async with contextlib.aclosing(raw_chunks(answer, bounds)) as chunks:
                    async for raw in chunks:
                        for line in lines.feed(raw):
                            if not line.startswith(b"data:"):
                                continue  # an SSE comment, event name, or the blank line
                            payload = line[len(b"data:") :].strip()
                            if payload == b"[DONE]":
                                done = True
                                break
                            try:
                                chunk = json.loads(payload)
                            except ValueError as exc:
                                raise UpstreamUnavailable(
                                    f"upstream {url}: a chunk that is not JSON "
                                    f"({len(payload)} bytes)"
                                ) from exc
                            if isinstance(chunk, Mapping):
                                yield chunk
                        if done:
                            break
            finally:
                await answer.aclose()
        except httpx.HTTPError as exc:
            raise unavailable(url, exc) from exc
        if not done:
            raise UpstreamUnavailable(f"upstream {url}: the stream ended before [DONE]")
