"""Reading an upstream's answers within bounds: bytes per answer, bytes per stream line, and a
deadline for the whole read.

httpx bounds the wait for each read of the socket (``timeout_s``) but nothing else: its
``aiter_lines`` holds a line however long it grows, ``aread`` an answer however large, and a
server that sends a byte (or an SSE comment) before each read times out holds a call for ever.
Here every answer is read raw (``aiter_raw``: the client asks for ``identity`` and refuses a
compressed answer, so a small compressed body cannot inflate past the bounds), counted as it
comes, and abandoned with ``UpstreamBoundExceeded`` — naming the bound, never the content — as
soon as it passes one. The deadline is wall time on the event loop (``loop.time()``), as
httpx's own timeouts are: it bounds network I/O, not a scheduling decision, so it does not
read the node's (possibly scaled) clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import httpx


class UpstreamUnavailable(RuntimeError):
    """The upstream server did not serve (down, 5xx, refused the runtime, timed out, or its
    stream broke off): the runtime's fault, retryable elsewhere. Its message names the URL,
    the status or the bound, never what the server sent."""


class UpstreamUnreachable(UpstreamUnavailable):
    """The server could not be reached at all (no connection): the engine counts it down
    (``Health``) until it answers again."""


class UpstreamBoundExceeded(UpstreamUnavailable):
    """An answer passed one of the read bounds (its message names the option and its value)."""


_EOL = re.compile(rb"\r\n|\r|\n")


class LineSplitter:
    """SSE lines (ended by CRLF, LF or CR) out of raw bytes, each at most ``max_line_bytes``."""

    def __init__(self, max_line_bytes: int, where: str) -> None:
        self._max = max_line_bytes
        self._where = where
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes; ``UpstreamBoundExceeded`` once a line passes the
        bound (the rest of it is never held)."""
        self._buffer += data
        lines: list[bytes] = []
        start = 0
        for end in _EOL.finditer(self._buffer):
            lines.append(bytes(self._buffer[start : end.start()]))
            start = end.end()
        del self._buffer[:start]
        if len(self._buffer) > self._max or any(len(line) > self._max for line in lines):
            raise UpstreamBoundExceeded(
                f"{self._where}: a stream line passed line_max_bytes ({self._max} bytes)"
            )
        return lines

    def rest(self) -> bytes:
        """What follows the last line end (a last line without one)."""
        return bytes(self._buffer)


@dataclass(frozen=True)
class ReadBounds:
    """What one read may take: at most ``max_bytes`` (the option ``bytes_option`` says so)
    before loop time ``deadline`` (``time_option``: the option and its value, for the
    message); ``where``: the URL, for the message."""

    where: str
    max_bytes: int
    bytes_option: str
    deadline: float
    time_option: str

    @classmethod
    def within(
        cls, where: str, max_bytes: int, bytes_option: str, seconds: float, time_option: str
    ) -> ReadBounds:
        """Bounds whose deadline is ``seconds`` from now (loop time)."""
        deadline = asyncio.get_running_loop().time() + seconds
        return cls(where, max_bytes, bytes_option, deadline, f"{time_option} ({seconds:g} s)")

    def too_large(self) -> UpstreamBoundExceeded:
        """The error of an answer past ``max_bytes``."""
        return UpstreamBoundExceeded(
            f"{self.where}: the answer passed {self.bytes_option} ({self.max_bytes} bytes)"
        )

    def too_slow(self) -> UpstreamBoundExceeded:
        """The error of an answer still coming at the deadline."""
        where, option = self.where, self.time_option
        return UpstreamBoundExceeded(f"{where}: the answer took longer than {option}")


async def raw_chunks(answer: httpx.Response, bounds: ReadBounds) -> AsyncGenerator[bytes, None]:
    """``answer``'s body as it arrives, raw; ``UpstreamBoundExceeded`` once it passes the
    bytes or runs past the deadline of ``bounds``, whatever arrives meanwhile. Each read is
    awaited within the deadline (never across a ``yield``), so the caller may hold a chunk
    as long as it likes."""
    encoding = answer.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise UpstreamUnavailable(f"{bounds.where}: a compressed answer ({encoding}) is not read")
    chunks = answer.aiter_raw()
    seen = 0
    while True:
        try:
            async with asyncio.timeout_at(bounds.deadline):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            raise bounds.too_slow() from exc
        seen += len(chunk)
        if seen > bounds.max_bytes:
            raise bounds.too_large()
        yield chunk


async def read_body(answer: httpx.Response, bounds: ReadBounds) -> bytes:
    """``answer``'s whole body within ``bounds`` (``raw_chunks``)."""
    body = bytearray()
    async for chunk in raw_chunks(answer, bounds):
        body += chunk
    return bytes(body)


async def read_head(answer: httpx.Response, bounds: ReadBounds) -> bytes:
    """At most the first ``bounds.max_bytes`` of ``answer``'s body (an error answer's
    message: what follows is never read), before the deadline; what arrived if the read
    fails."""
    head = bytearray()
    unbounded = ReadBounds(bounds.where, 1 << 62, "", bounds.deadline, bounds.time_option)
    try:
        async with contextlib.aclosing(raw_chunks(answer, unbounded)) as chunks:
            async for chunk in chunks:
                head += chunk
                if len(head) >= bounds.max_bytes:
                    break
    except (UpstreamUnavailable, httpx.HTTPError):
        pass
    return bytes(head[: bounds.max_bytes])
