"""``BodyDeadline``: ASGI middleware that bounds the time a request's body takes to arrive.

The rule: once the app first asks for the body, the whole of it (every ``http.request``
message up to the one without ``more_body``) must arrive within ``timeout_s``; otherwise the
app's read raises :class:`BodyTimeout`, which the app answers (the proxy: 408 in the API's
envelope, with ``Connection: close`` so the rest of the body is not waited for). Reads after
the body is complete (a streaming response listening for the client's disconnect) are not
bounded, and a client that disconnects mid-body is passed through as ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

BODY_TIMEOUT_S = 60.0
"""Default time for a request's whole body to arrive (s)."""


class BodyTimeout(Exception):
    """The request's body did not arrive within ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"The request body did not arrive within {timeout_s:g} s.")
        self.timeout_s = timeout_s


class BodyDeadline:
    """ASGI middleware: the whole body must arrive within ``timeout_s`` seconds (loop time)
    of the app's first read, else that read raises :class:`BodyTimeout`."""

    def __init__(self, app: App, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline: float | None = None
        complete = False

        async def bounded() -> Message:
            nonlocal deadline, complete
            if complete:
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.timeout_s) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, bounded, send)
