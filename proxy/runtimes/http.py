"""``HttpRuntime``: the ``RuntimeClient`` (base.py) of a runtime server reached over HTTP
(runtime/server.py).

Streams ``/v1/runtime/generate`` as NDJSON events (decoding.py reads them, and the status
and placement answers). ``status()`` comes from a ``StatusCache``
(status_cache.py: ``status_ttl_s`` fresh, then served while one refresh runs in the
background). Hints, ends and moves never fail the call path (a failure is logged); an end the
server does not take is kept and sent again (notices.py). A runtime that fails a call raises
``RuntimeUnavailable`` (the gateway answers 503); one that takes no connection raises
``RuntimeUnreachable`` (nothing was sent: the call is routed again) and is left out of routing
at once (``StatusCache.failed``), not only after its status next fails.

The client is aiohttp's, on kept-alive connections (no limit on their number: a streamed call
holds one for its whole length). On a 127 KB call at concurrency 1 and 16, httpx spent 1.59
and 2.37 ms of CPU where aiohttp spends 0.41 and 0.26 ms (bench/http_clients.py;
docs/proxy-overhead.md, "The HTTP hops and replicas").
Leaving a call early (the client went away) closes its connection, so the runtime sees the
disconnect and aborts the engine's request.

With a ``token`` every request carries ``Authorization: Bearer <token>`` (the runtime's
``TALARIA_RUNTIME_TOKEN``, runtime/auth.py). A runtime that answers 401 at ``start`` fails it
at once with ``RuntimeTokenRefused``, not after the retries meant for a runtime still starting.

A placement controller (proxy/placement/loop.py) reads the server's ``demand`` and changes
its models through ``add_model``, ``drain_model`` and ``remove_model``
(runtime/placement_routes.py); each change raises ``PlacementRefused`` with the server's
answer when it does not take it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import aiohttp
import msgspec

from talaria.core.http_edge import CLIENT_KEEP_ALIVE_S
from talaria.core.protocol_calls import request_to_dict
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.runtimes.base import RuntimeUnavailable, RuntimeUnreachable
from talaria.proxy.runtimes.decoding import (
    PlacementRefused,
    StatusReader,
    decode_event,
    ndjson_lines,
    placement_answer,
)
from talaria.proxy.runtimes.notices import SessionNotices
from talaria.proxy.runtimes.status_cache import StatusCache

log = logging.getLogger("talaria.proxy.runtimes.http")

CONNECT_TIMEOUT_S = 5.0
STATUS_TIMEOUT_S = 5.0
"""How long a status read may take (``TALARIA_STATUS_TIMEOUT_S``) before the runtime counts
as down and is left out of routing until it answers again (status_cache.py): a runtime answers
in milliseconds (its status is a snapshot of the node), so seconds mean a stopped, wedged or
unreachable process."""
JSON = {"content-type": "application/json"}
PLACEMENT_TIMEOUT_S = 1800.0
"""How long an add or a remove may take: an engine's start (vLLM: tens of seconds on the CPU
build, minutes for a 100B+ model from storage) or its running calls' end."""


class RuntimeTokenRefused(RuntimeUnavailable):
    """The runtime answered 401: it wants a runtime token, or another one."""


def described(exc: BaseException) -> str:
    """``exc`` for a log line or an error message. Not its ``repr`` for an aiohttp answer
    error (``raise_for_status``): that holds the request's headers, the runtime token among
    them; its ``str`` is the status, the reason and the URL."""
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{type(exc).__name__}({exc})"
    return repr(exc)


class HttpRuntime:
    """A runtime server at ``url``: calls stream as NDJSON events; ``status()`` is cached
    (status_cache.py)."""

    kind = "http"

    def __init__(
        self,
        url: str,
        *,
        status_ttl_s: float = 0.05,
        status_stale_s: float = 0.0,
        timeout_s: float = 600.0,
        status_timeout_s: float = STATUS_TIMEOUT_S,
        token: str | None = None,
    ) -> None:
        """``token``: the runtime's bearer token (None: send none)."""
        self._status_timeout = aiohttp.ClientTimeout(
            total=status_timeout_s, connect=min(CONNECT_TIMEOUT_S, status_timeout_s)
        )
        self.url = url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self.address: str | None = self.url
        self.name = self.url
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT_S, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._reader = StatusReader(lambda: self.name)
        """What its status documents say (decoding.py)."""
        self.status_cache = StatusCache(
            self._fetch_status, ttl_s=status_ttl_s, stale_s=status_stale_s, name=self.name
        )
        self._notices = SessionNotices(lambda: self._http, lambda: self.name)
        """Hints, moves and ends, and the ends the server has not taken (notices.py)."""

    @property
    def models(self) -> tuple[str, ...]:
        """The models the server hosts (empty before ``start``)."""
        return self._reader.models

    @property
    def context_windows(self) -> Mapping[str, int]:
        """The windows the runtime's status reported at ``start`` (its engines'
        ``max_model_len``)."""
        return self._reader.windows

    @property
    def draining_models(self) -> frozenset[str]:
        """The models the server's last status read listed as draining."""
        return self._reader.draining

    @property
    def weight_budget_bytes(self) -> float:
        """The pinned weights the node may hold (its status; a placement's budget)."""
        return self._reader.weight_budget_bytes

    @property
    def quantum_s(self) -> float | None:
        """The node's slot quantum (its status)."""
        return self._reader.quantum_s

    @property
    def server(self) -> str | None:
        """The node's hardware, a catalog server (its status)."""
        return self._reader.server

    @property
    def gpus(self) -> int | None:
        """The GPUs of the node's group (its status)."""
        return self._reader.gpus

    @property
    def _http(self) -> aiohttp.ClientSession:
        """The HTTP session, made on first use (inside the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                self.url,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEP_ALIVE_S),
                auto_decompress=False,
                headers=self._headers,
            )
        return self._session

    async def start(self, attempts: int = 5) -> None:
        """Learn the instance's name and models. A runtime that has just started may drop the
        first connections: try ``attempts`` times, 0.2 s, 0.4 s, ... apart, then fail clearly;
        a 401 fails at once (``RuntimeTokenRefused``)."""
        for attempt in range(attempts):
            try:
                data, dropped = await self._get_status()
                break
            except RuntimeTokenRefused:
                raise
            except RuntimeUnavailable as exc:
                if attempt == attempts - 1:
                    raise RuntimeUnavailable(f"runtime {self.url} is not reachable: {exc}") from exc
                await asyncio.sleep(0.2 * 2**attempt)
        self.name = data["instance"]
        self.status_cache.put(self._reader.read(data, dropped))

    async def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """POST the call and yield its events as the server streams them; no connection to
        the server: ``RuntimeUnreachable``, and its status counts as failed from now on."""
        body = msgspec.json.encode(request_to_dict(request))
        try:
            async with self._http.post("/v1/runtime/generate", data=body, headers=JSON) as answer:
                if answer.status != 200:
                    text = (await answer.read()).decode(errors="replace")
                    raise RuntimeUnavailable(
                        f"runtime {self.name} answered {answer.status}: {text[:200]}"
                    )
                async for line in ndjson_lines(answer.content.iter_any()):
                    yield decode_event(msgspec.json.decode(line))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            self.status_cache.failed(exc)
            message = f"runtime {self.name} is unreachable: {described(exc)}"
            raise RuntimeUnreachable(message) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RuntimeUnavailable(f"runtime {self.name} failed: {described(exc)}") from exc

    async def status(self) -> InstanceStatus:
        """The server's status for routing (status_cache.py says how old it may be)."""
        return await self.status_cache.get()

    async def _fetch_status(self) -> InstanceStatus:
        data, dropped = await self._get_status()
        return self._reader.read(data, dropped)

    async def _get_status(self) -> tuple[dict[str, Any], list[str]]:
        try:
            async with self._http.get("/v1/runtime/status", timeout=self._status_timeout) as answer:
                if answer.status == 401:
                    raise RuntimeTokenRefused(self._refused())
                answer.raise_for_status()
                raw = await answer.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RuntimeUnavailable(
                f"runtime {self.name} status failed: {described(exc)}"
            ) from exc
        return self._reader.parse(raw)

    def _refused(self) -> str:
        """What a 401 means, for the operator (the token itself is never shown)."""
        sent = "a token it does not accept" if self._headers else "no token"
        return (
            f"runtime {self.url} refused the runtime token (TALARIA_RUNTIME_TOKEN): the proxy "
            f"sent {sent}; set TALARIA_RUNTIME_TOKEN to the runtime's"
        )

    async def status_document(self) -> dict[str, Any]:
        """The runtime's whole status document, uncached: InstanceStatus's fields plus
        ``model_names``, recent ``slots`` and per-model ``engines`` info."""
        return (await self._get_status())[0]

    async def demand(self, window_s: float) -> dict[str, Any]:
        """The runtime's demand document over the last ``window_s`` (``GET
        /v1/runtime/demand``: ``demand``, ``call_s``, ``finished_calls`` per model)."""
        try:
            async with self._http.get(
                "/v1/runtime/demand", params={"window_s": str(window_s)}
            ) as answer:
                answer.raise_for_status()
                data = msgspec.json.decode(await answer.read())
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            raise RuntimeUnavailable(f"runtime {self.name} demand: {described(exc)}") from exc
        if not isinstance(data, dict):
            raise RuntimeUnavailable(f"runtime {self.name} demand: not a JSON object")
        return data

    async def add_model(self, entry: Mapping[str, Any]) -> None:
        """Host one more model: ``entry`` is its ``[[model]]`` table (the engine starts)."""
        await self._place("POST", "/v1/runtime/models", entry)

    async def drain_model(self, name: str) -> None:
        """Mark ``name`` draining (no new session is routed to it here)."""
        await self._place("POST", f"/v1/runtime/models/{name}/drain", None)

    async def remove_model(self, name: str) -> None:
        """Stop hosting ``name`` (once its calls here are done)."""
        await self._place("DELETE", f"/v1/runtime/models/{name}", None)

    async def _place(self, method: str, path: str, body: Mapping[str, Any] | None) -> None:
        """One placement request; the models of its answer are learned at once."""
        try:
            async with self._http.request(
                method,
                path,
                data=msgspec.json.encode(body or {}),
                headers=JSON,
                timeout=aiohttp.ClientTimeout(total=PLACEMENT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            ) as answer:
                raw = await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            message = f"runtime {self.name}: {method} {path}: {described(exc)}"
            raise PlacementRefused(message, 0) from exc
        self._reader.learn(placement_answer(raw, status, f"runtime {self.name}: {method} {path}"))
        try:  # the whole status now (windows, residency), so routing sees the change at once
            self.status_cache.put(await self._fetch_status())
        except RuntimeUnavailable as exc:
            log.warning("runtime %s: status after %s %s failed: %r", self.name, method, path, exc)

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        """Pass the tool-gap hint on (best effort: notices.py)."""
        await self._notices.hint(session_key, expected_gap_s)

    async def end_sessions(self, session_keys: Sequence[str]) -> None:
        """Tell the server these sessions ended (what it does not take is sent again by
        ``resend_ends``: notices.py)."""
        await self._notices.end(session_keys)

    async def resend_ends(self) -> None:
        """Send the ends the server did not take again (notices.py)."""
        await self._notices.resend()

    async def session_moved(self, session_key: str) -> None:
        """Tell the server the session moved to another instance (best effort)."""
        await self._notices.moved(session_key)

    async def close(self) -> None:
        """Stop the status refresh and close the HTTP connections."""
        await self.status_cache.close()
        if self._session is not None:
            await self._session.close()
