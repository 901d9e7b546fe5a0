"""``HttpRuntime``: the ``RuntimeClient`` (base.py) of a runtime server reached over HTTP
(runtime/server.py).

Streams ``/v1/runtime/generate`` as NDJSON events. ``status()`` comes from a ``StatusCache``
(status_cache.py: ``status_ttl_s`` fresh, then served while one refresh runs in the
background). Hints, ends and moves are best effort: a failure is logged, never raised (the call
path must not fail because a hint got lost). A runtime that cannot be reached fails the call
with ``RuntimeUnavailable`` (the gateway answers 503).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
import msgspec

from talaria.core.protocol import (
    ErrorEvent,
    ProtocolError,
    event_from_dict,
    request_to_dict,
    status_from_dict,
)
from talaria.core.status import InstanceStatus
from talaria.core.types import (
    CallRejected,
    CallRequest,
    GenerationEvent,
)
from talaria.proxy.runtimes.base import RuntimeUnavailable
from talaria.proxy.runtimes.status_cache import StatusCache

log = logging.getLogger("talaria.proxy.runtimes.http")


def decode_event(data: dict[str, Any]) -> GenerationEvent:
    """A generation event, or raise: ``CallRejected`` for the caller's fault,
    ``RuntimeUnavailable`` for the runtime's."""
    event = event_from_dict(data)
    if isinstance(event, ErrorEvent):
        if event.code is not None:
            raise CallRejected(event.code, event.message, event.param)
        raise RuntimeUnavailable(event.message)
    return event


class HttpRuntime:
    """A runtime server at ``url``: calls stream as NDJSON events; ``status()`` is cached
    (status_cache.py)."""

    kind = "http"

    def __init__(
        self,
        url: str,
        *,
        status_ttl_s: float = 0.05,
        status_stale_s: float = 1.0,
        timeout_s: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.address: str | None = self.url
        self.name = self.url
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0)
        )
        self._models: tuple[str, ...] = ()
        self._windows: dict[str, int] = {}
        self.status_cache = StatusCache(
            self._fetch_status, ttl_s=status_ttl_s, stale_s=status_stale_s
        )

    @property
    def models(self) -> tuple[str, ...]:
        """The models the server hosts (empty before ``start``)."""
        return self._models

    @property
    def context_windows(self) -> Mapping[str, int]:
        """The windows the runtime's status reported at ``start`` (its engines'
        ``max_model_len``)."""
        return self._windows

    async def start(self, attempts: int = 5) -> None:
        """Learn the instance's name and models. A runtime that has just started may drop the
        first connections: try ``attempts`` times, 0.2 s, 0.4 s, ... apart, then fail clearly."""
        for attempt in range(attempts):
            try:
                response = await self._client.get("/v1/runtime/status")
                response.raise_for_status()
                break
            except httpx.HTTPError as exc:
                if attempt == attempts - 1:
                    raise RuntimeUnavailable(
                        f"runtime {self.url} is not reachable: {exc!r}"
                    ) from exc
                await asyncio.sleep(0.2 * 2**attempt)
        data = response.json()
        self.name = data["instance"]
        self._models = tuple(data["model_names"])
        engines = data.get("engines") or {}
        self._windows = {
            m: int(info["max_model_len"])
            for m, info in engines.items()
            if isinstance(info, dict) and isinstance(info.get("max_model_len"), int)
        }
        try:
            self.status_cache.put(status_from_dict(data))
        except ProtocolError as exc:
            raise RuntimeUnavailable(f"runtime {self.url}: {exc}") from exc

    async def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """POST the call and yield its events as the server streams them."""
        try:
            async with self._client.stream(
                "POST",
                "/v1/runtime/generate",
                content=msgspec.json.encode(request_to_dict(request)),
                headers={"content-type": "application/json"},
            ) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    raise RuntimeUnavailable(
                        f"runtime {self.name} answered {response.status_code}: {body[:200]}"
                    )
                async for line in response.aiter_lines():
                    if line.strip():
                        yield decode_event(msgspec.json.decode(line))
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime {self.name} failed: {exc!r}") from exc

    async def status(self) -> InstanceStatus:
        """The server's status for routing (status_cache.py says how old it may be)."""
        return await self.status_cache.get()

    async def _fetch_status(self) -> InstanceStatus:
        try:
            response = await self._client.get("/v1/runtime/status")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime {self.name} status failed: {exc!r}") from exc
        try:
            return status_from_dict(msgspec.json.decode(response.content))
        except (ProtocolError, msgspec.DecodeError) as exc:
            raise RuntimeUnavailable(f"runtime {self.name} status: {exc}") from exc

    async def status_document(self) -> dict[str, Any]:
        """The runtime's whole status document, uncached: InstanceStatus's fields plus
        ``model_names``, recent ``slots`` and per-model ``engines`` info."""
        try:
            response = await self._client.get("/v1/runtime/status")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"runtime {self.name} status failed: {exc!r}") from exc
        data: dict[str, Any] = response.json()
        return data

    async def _post(self, path: str, body: dict[str, Any] | None = None) -> None:
        try:
            response = await self._client.post(path, json=body or {}, timeout=2.0)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("runtime %s: %s failed: %r", self.name, path, exc)

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        """Pass the tool-gap hint on (best effort)."""
        await self._post(
            f"/v1/runtime/sessions/{session_key}/hint", {"expected_gap_s": expected_gap_s}
        )

    async def end_session(self, session_key: str) -> None:
        """Tell the server the session ended (best effort)."""
        await self._post(f"/v1/runtime/sessions/{session_key}/end")

    async def session_moved(self, session_key: str) -> None:
        """Tell the server the session moved to another instance (best effort)."""
        await self._post(f"/v1/runtime/sessions/{session_key}/moved")

    async def close(self) -> None:
        """Stop the status refresh and close the HTTP connections."""
        await self.status_cache.close()
        await self._client.aclose()
