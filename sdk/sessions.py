"""Session scopes: ``with session() as s:`` / ``async with session() as s:``.

The active session lives in a :class:`contextvars.ContextVar`, so it follows the code that
runs inside the block: an asyncio task created inside it sees it (tasks copy the context), two
tasks or threads that each open their own scope never see each other's, and nested scopes
stack (the inner one wins; its ``parent`` defaults to the enclosing session's id). A new
thread starts with an empty context: run it under ``contextvars.copy_context().run`` to share
the scope. The clients (:mod:`talaria.sdk.client`) read the active session on every request.

A session learns its own tool gaps: when a reply finishes with tool calls, the session is *in a
tool gap*; the next request ends it, and the time from that reply's end to the request is
observed. ``expected_gap_s`` is the mean of the observed gaps (``default_gap_s`` before the
first). Leaving the block ends the session on every Talaria base URL it used, unless
``end_on_exit=False``.

``priority`` (``interactive``, ``standard``, ``batch``) and ``deadline_s`` go with every call
of the session (``X-Talaria-Priority``, ``X-Talaria-Deadline-S``): under load, the proxy's
nodes serve a higher class first. A nested scope without a priority takes its enclosing
session's.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
import weakref
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType

from talaria.sdk.headers import DEFAULT_GAP_S, check_priority, endpoint_url, session_headers
from talaria.sdk.sidechannel import SideChannel, default_channel, log

_CURRENT: ContextVar[Session | None] = ContextVar("talaria_session", default=None)
_LIVE: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()


def _now() -> float:
    """The session's clock (monotonic seconds); tests replace it."""
    return time.monotonic()


def current_session() -> Session | None:
    """The innermost active session scope here (this task or thread), or None."""
    return _CURRENT.get()


def live_session(session_id: str) -> Session | None:
    """The live :class:`Session` object that last sent calls as ``session_id``, if any."""
    with _LIVE_LOCK:
        return _LIVE.get(session_id)


def new_session_id() -> str:
    """A fresh random session id."""
    return f"sess-{uuid.uuid4().hex}"


@dataclass
class _Endpoint:
    """A base URL the session called, the auth headers to reach it, and whether it answered
    as Talaria (None: not known yet)."""

    base_url: str
    headers: dict[str, str]
    talaria: bool | None = None


class Session:
    """One agent session: its id, its parent, what the clients observed, hints and end.

    Make one with :func:`session`. Thread-safe: calls may come from several tasks or threads.
    """

    def __init__(
        self,
        id: str | None = None,
        parent: str | None = None,
        *,
        end_on_exit: bool = True,
        default_gap_s: float = DEFAULT_GAP_S,
        channel: SideChannel | None = None,
        priority: str | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self.id = id or new_session_id()
        self.parent = parent
        self.priority = check_priority(priority, deadline_s)
        self.deadline_s = deadline_s
        self.end_on_exit = end_on_exit
        self.default_gap_s = default_gap_s
        self._channel = channel or default_channel()
        self._lock = threading.Lock()
        self._tokens: list[Token[Session | None]] = []
        self._endpoints: dict[str, _Endpoint] = {}
        self._pending: list[Future[bool]] = []
        self._gaps: list[float] = []
        self._calls = 0
        self._tool_calls = 0
        self._hints = 0
        self._started: float | None = None
        self._last_end: float | None = None
        self._ended_at: float | None = None
        self._in_tool_gap = False

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, parent={self.parent!r}, calls={self._calls})"

    # -- what the session knows --------------------------------------------------------------
    @property
    def calls(self) -> int:
        """Requests sent in this session (retries not counted)."""
        return self._calls

    @property
    def tool_calls(self) -> int:
        """Replies that finished with tool calls."""
        return self._tool_calls

    @property
    def hints(self) -> int:
        """Explicit hints sent (:meth:`tool_gap`)."""
        return self._hints

    @property
    def gaps_s(self) -> list[float]:
        """The tool gaps observed so far, seconds, in order."""
        with self._lock:
            return list(self._gaps)

    @property
    def expected_gap_s(self) -> float:
        """The tool gap this session expects: the mean of its observed gaps, else the
        default."""
        with self._lock:
            return self._expected_gap_locked()

    def _expected_gap_locked(self) -> float:
        return sum(self._gaps) / len(self._gaps) if self._gaps else self.default_gap_s

    @property
    def in_tool_gap(self) -> bool:
        """A reply finished with tool calls (or a hint was sent) and no call has followed."""
        return self._in_tool_gap

    @property
    def ended(self) -> bool:
        """:meth:`end` or :meth:`aend` has run on this session."""
        return self._ended_at is not None

    @property
    def base_urls(self) -> list[str]:
        """The base URLs this session sent calls to (without a trailing slash)."""
        with self._lock:
            return list(self._endpoints)

    @property
    def sct_s(self) -> float | None:
        """Session completion time seen by the client: first request to the end (or to the
        last reply while the session is open); None before the first request."""
        with self._lock:
            if self._started is None:
                return None
            last = self._ended_at or self._last_end or _now()
            return last - self._started

    def headers(self, *, tools: bool = False) -> dict[str, str]:
        """The headers for a call in this session, for clients other than the SDK's (with
        ``tools=True``: plus the tool-gap expectation)."""
        gap = self.expected_gap_s if tools else None
        return self._headers(gap)

    def _headers(self, gap_s: float | None) -> dict[str, str]:
        return session_headers(
            self.id,
            self.parent,
            tool_gap_s=gap_s,
            priority=self.priority,
            deadline_s=self.deadline_s,
        )

    def attach(self, base_url: str, *, api_key: str | None = None) -> None:
        """Calls of this session also go to ``base_url`` through another client (LiteLLM's
        ``openai/`` route, a framework's own client): send hints and the end there too."""
        base_url = base_url.rstrip("/")
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        with self._lock:
            endpoint = self._endpoints.get(base_url)
            if endpoint is None:
                self._endpoints[base_url] = _Endpoint(base_url, auth)
            elif auth:
                endpoint.headers = auth
        self._channel.warm()

    # -- what the clients report (internal) --------------------------------------------------
    def on_request(
        self, base_url: str, auth: dict[str, str], *, offers_tools: bool, first_attempt: bool
    ) -> dict[str, str]:
        """A request is being built: record it; returns the headers to add."""
        now = _now()
        base_url = base_url.rstrip("/")
        with self._lock:
            endpoint = self._endpoints.get(base_url)
            if endpoint is None:
                self._endpoints[base_url] = _Endpoint(base_url, dict(auth))
                self._channel.warm()
            else:
                endpoint.headers = dict(auth)
            if first_attempt:
                self._calls += 1
                if self._started is None:
                    self._started = now
                if self._in_tool_gap and self._last_end is not None:
                    self._gaps.append(max(0.0, now - self._last_end))
                self._in_tool_gap = False
            gap = self._expected_gap_locked() if offers_tools else None
        with _LIVE_LOCK:
            _LIVE[self.id] = self
        return self._headers(gap)

    def on_reply(self, base_url: str, *, talaria: bool, finished: bool, tool_calls: bool) -> None:
        """A reply (or a chunk of one) arrived from ``base_url``."""
        now = _now()
        base_url = base_url.rstrip("/")
        with self._lock:
            endpoint = self._endpoints.get(base_url)
            if endpoint is not None and endpoint.talaria is not True:
                endpoint.talaria = talaria
            if finished:
                self._last_end = now
            if tool_calls:
                self._tool_calls += 1
                self._in_tool_gap = True

    # -- hints and end -----------------------------------------------------------------------
    def _targets(self) -> list[_Endpoint]:
        """Endpoints that may be Talaria (not known to be another server)."""
        return [e for e in self._endpoints.values() if e.talaria is not False]

    def tool_gap(self, expected_s: float | None = None, tool: str | None = None) -> None:
        """The agent starts a tool expected to take ``expected_s`` seconds (default: the
        session's estimate): sends a hint to each Talaria base URL the session used.
        Fire-and-forget: returns at once and never raises."""
        with self._lock:
            expected = self._expected_gap_locked() if expected_s is None else expected_s
            self._in_tool_gap = True
            self._hints += 1
            self._pending = [f for f in self._pending if not f.done()]
            targets = [(e.base_url, dict(e.headers)) for e in self._targets()]
        if not targets:
            log.debug("talaria: hint for %s not sent: no Talaria call yet", self.id)
        body = {"expected_s": max(0.0, float(expected)), "tool": tool}
        for base_url, headers in targets:
            url = endpoint_url(base_url, self.id, "hints")
            future = self._channel.submit(url, body, headers)
            with self._lock:
                self._pending.append(future)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for this session's pending hints; True if none is left."""
        with self._lock:
            pending = list(self._pending)
        if not pending:
            return True
        _, not_done = wait_futures(pending, timeout=timeout)
        return not not_done

    def _begin_end(self) -> tuple[list[Future[bool]], list[tuple[str, dict[str, str]]]] | None:
        with self._lock:
            if self._ended_at is not None:
                return None
            self._ended_at = _now()
            pending, self._pending = self._pending, []
            targets = [
                (endpoint_url(e.base_url, self.id, "end"), dict(e.headers)) for e in self._targets()
            ]
        with _LIVE_LOCK:
            if _LIVE.get(self.id) is self:
                del _LIVE[self.id]
        return pending, targets

    def end(self) -> None:
        """End the session now on each Talaria base URL it used (once; never raises). Blocks
        for at most about twice the side channel's timeout; in async code use :meth:`aend`."""
        begun = self._begin_end()
        if begun is None:
            return
        pending, targets = begun
        if pending:
            wait_futures(pending, timeout=self._channel.timeout_s)
        for url, headers in targets:
            self._channel.post(url, None, headers)

    async def aend(self) -> None:
        """:meth:`end` without blocking the event loop."""
        begun = self._begin_end()
        if begun is None:
            return
        pending, targets = begun
        if pending:
            await asyncio.wait(
                [asyncio.wrap_future(f) for f in pending], timeout=self._channel.timeout_s
            )
        ends = [asyncio.wrap_future(self._channel.submit(u, None, h)) for u, h in targets]
        if ends:
            await asyncio.gather(*ends)

    # -- the scope ---------------------------------------------------------------------------
    def _activate(self) -> None:
        enclosing = _CURRENT.get()
        if enclosing is not None and enclosing is not self:
            if self.parent is None:
                self.parent = enclosing.id
            if self.priority is None:
                self.priority = enclosing.priority
        self._tokens.append(_CURRENT.set(self))

    def _deactivate(self) -> None:
        token = self._tokens.pop()
        try:
            _CURRENT.reset(token)
        except ValueError:  # left in another context than the one it was entered in
            _CURRENT.set(token.old_value if token.old_value is not Token.MISSING else None)

    def __enter__(self) -> Session:
        self._activate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deactivate()
        if self.end_on_exit:
            self.end()

    async def __aenter__(self) -> Session:
        self._activate()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._deactivate()
        if self.end_on_exit:
            await self.aend()


def session(
    id: str | None = None,
    parent: str | None = None,
    *,
    end_on_exit: bool = True,
    default_gap_s: float = DEFAULT_GAP_S,
    channel: SideChannel | None = None,
    priority: str | None = None,
    deadline_s: float | None = None,
) -> Session:
    """A session scope: ``with session() as s:`` or ``async with session() as s:``.

    ``id``: generated if None. ``parent``: the parent session's id; None means the enclosing
    scope's session, if any. ``end_on_exit``: end the session when the block is left.
    ``default_gap_s``: the tool gap expected before one is observed. ``channel``: where hints
    and ends go (default: a shared :class:`~talaria.sdk.sidechannel.SideChannel`).
    ``priority``: every call's class (``interactive``, ``standard`` or ``batch``; None: the
    enclosing scope's, else the API key's). ``deadline_s``: every call's deadline, seconds
    after it reaches the proxy. ``ValueError`` for a priority or deadline the proxy would
    refuse.
    """
    return Session(
        id,
        parent,
        end_on_exit=end_on_exit,
        default_gap_s=default_gap_s,
        channel=channel,
        priority=priority,
        deadline_s=deadline_s,
    )
