"""``OpenAI`` and ``AsyncOpenAI``: the official clients, plus the active session on each call.

Two hooks of the official client's base class, nothing wrapped:

- ``_build_headers`` (what ``_build_request`` consults for every attempt, retries included)
  adds :func:`~talaria.sdk.headers.session_headers` of the active :func:`session` scope, and
  ``X-Talaria-Tool-Gap-Ms`` when the request offers tools. A call whose ``extra_headers``
  already name ``X-Talaria-Session-Id`` is left as the caller made it.
- ``_process_response_data`` (what every parse goes through: plain calls, each streamed chunk,
  ``with_raw_response(...).parse()``, ``with_streaming_response``, ``parse``, the Responses
  API) reports to the session whether the reply finished, with tool calls or not, and
  whether the server is Talaria (it sets ``x-talaria-session-id`` on its replies).

So streaming, ``with_raw_response``, ``with_options`` / ``copy`` (they build the same class),
``beta``/``parse`` helpers and the Responses API behave exactly as upstream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import openai
from typing_extensions import override

from talaria.sdk.headers import REPLY_SESSION_ID, SESSION_ID, has_header
from talaria.sdk.replies import finish_of, offers_tools
from talaria.sdk.sessions import current_session, live_session

if TYPE_CHECKING:
    import httpx2
    from openai._models import FinalRequestOptions

_T = TypeVar("_T")


def _add_session(
    base_url: str, headers: httpx2.Headers, options: FinalRequestOptions, retries_taken: int
) -> None:
    session = current_session()
    if session is None or has_header(options.headers, SESSION_ID):
        return
    auth = {"Authorization": headers["authorization"]} if "authorization" in headers else {}
    tools = offers_tools(options.json_data) or offers_tools(options.extra_json)
    extra = session.on_request(base_url, auth, offers_tools=tools, first_attempt=not retries_taken)
    for name, value in extra.items():
        if name not in headers:
            headers[name] = value


def _observe(base_url: str, data: object, response: httpx2.Response) -> None:
    try:
        session_id = response.request.headers.get(SESSION_ID)
    except RuntimeError:  # a response built without a request
        return
    session = live_session(session_id) if session_id else None
    if session is None:
        return
    finish = finish_of(data)
    session.on_reply(
        base_url,
        talaria=REPLY_SESSION_ID in response.headers,
        finished=finish is not None,
        tool_calls=bool(finish),
    )


class OpenAI(openai.OpenAI):
    """:class:`openai.OpenAI` whose calls join the active :func:`~talaria.sdk.session`."""

    @override
    def _build_headers(
        self, options: FinalRequestOptions, *, retries_taken: int = 0
    ) -> httpx2.Headers:
        headers = super()._build_headers(options, retries_taken=retries_taken)
        _add_session(str(self.base_url), headers, options, retries_taken)
        return headers

    @override
    def _process_response_data(
        self, *, data: object, cast_to: type[_T], response: httpx2.Response
    ) -> _T:
        _observe(str(self.base_url), data, response)
        return super()._process_response_data(data=data, cast_to=cast_to, response=response)


class AsyncOpenAI(openai.AsyncOpenAI):
    """:class:`openai.AsyncOpenAI` whose calls join the active :func:`~talaria.sdk.session`."""

    @override
    def _build_headers(
        self, options: FinalRequestOptions, *, retries_taken: int = 0
    ) -> httpx2.Headers:
        headers = super()._build_headers(options, retries_taken=retries_taken)
        _add_session(str(self.base_url), headers, options, retries_taken)
        return headers

    @override
    def _process_response_data(
        self, *, data: object, cast_to: type[_T], response: httpx2.Response
    ) -> _T:
        _observe(str(self.base_url), data, response)
        return super()._process_response_data(data=data, cast_to=cast_to, response=response)


__all__ = ["AsyncOpenAI", "OpenAI"]
