"""What the proxy's HTTP runtime client tells a node of its sessions: tool-gap hints, moves and
ends (the wire: core/protocol_sessions.py), and the ends the node did not take.

Hints and moves are best effort: one lost costs a hold's accuracy, and the node's own
rules release what it holds. An end that never arrives leaves the session's entry, KV and
accounts on the node (issue 46: 12,000 conversations left 14,018 entries, and another
tenant's p50 went from 55 to 221 ms), so an end the runtime does not take (unreachable, an
error, a runtime that predates the ends route) is kept, at most ``MAX_PENDING_ENDS`` per
runtime, and sent again at the keeper's sweep (``resend``: every clock second,
``MAX_ENDS`` keys a request, until one fails). Beyond the bound the oldest are dropped, and
what the proxy cannot deliver at all (a proxy restarted meanwhile, a session evicted from
the book) the node forgets by itself once it idles past ``SchedulerConfig.forget_idle_s``
(runtime/scheduling/sessions.py): the two together leave nothing on a node for good.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import msgspec

from talaria.core.protocol_sessions import ENDS_ROUTE, MAX_ENDS, ends_to_dict, session_path

log = logging.getLogger("talaria.proxy.runtimes.http")

NOTICE_TIMEOUT_S = 2.0
"""How long one hint, move or ends request may take."""
MAX_PENDING_ENDS = 100_000
"""Ends kept per runtime while it does not take them (~100 B each: ~10 MB at most)."""
JSON = {"content-type": "application/json"}


class PendingEnds:
    """Session keys whose end a runtime has not taken yet, oldest first, at most ``limit``
    (the oldest dropped beyond it, counted in ``dropped``)."""

    def __init__(self, limit: int = MAX_PENDING_ENDS) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._limit = limit
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, keys: Sequence[str]) -> None:
        """Keep ``keys`` (again, at the back)."""
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self._limit:
            self._keys.popitem(last=False)
            self.dropped += 1

    def oldest(self, n: int) -> list[str]:
        """The ``n`` oldest keys (still kept)."""
        out: list[str] = []
        for key in self._keys:
            if len(out) == n:
                break
            out.append(key)
        return out

    def remove(self, keys: Sequence[str]) -> None:
        """The runtime took ``keys``."""
        for key in keys:
            self._keys.pop(key, None)


class SessionNotices:
    """Hints, moves and ends to one runtime over ``http()`` (its client session, made on
    first use); ``label()`` names the runtime in the log."""

    def __init__(
        self,
        http: Callable[[], aiohttp.ClientSession],
        label: Callable[[], str],
        limit: int = MAX_PENDING_ENDS,
    ) -> None:
        self._http = http
        self._label = label
        self.pending = PendingEnds(limit)
        self._failing = False

    async def post(self, path: str, body: dict[str, Any], *, quiet: bool = False) -> bool:
        """POST ``body`` to ``path``; whether the runtime took it (a 2xx). A failure is logged,
        never raised (``quiet``: once, until the runtime takes an end again)."""
        try:
            async with self._http().post(
                path,
                data=msgspec.json.encode(body),
                headers=JSON,
                timeout=aiohttp.ClientTimeout(total=NOTICE_TIMEOUT_S),
            ) as answer:
                if answer.status < 300:
                    return True
                failure = f"answered {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = f"{type(exc).__name__}({exc})"
        if not (quiet and self._failing):
            log.warning("runtime %s: %s failed: %s", self._label(), path, failure)
        self._failing = self._failing or quiet
        return False

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        """The session's tool gap (best effort)."""
        await self.post(session_path(session_key, "hint"), {"expected_gap_s": expected_gap_s})

    async def moved(self, session_key: str) -> None:
        """The session's next call went to another instance (best effort)."""
        await self.post(session_path(session_key, "moved"), {})

    async def end(self, session_keys: Sequence[str]) -> None:
        """These sessions ended: ``MAX_ENDS`` a request; what the runtime does not take is
        kept for :meth:`resend`."""
        keys = list(dict.fromkeys(session_keys))
        for start in range(0, len(keys), MAX_ENDS):
            chunk = keys[start : start + MAX_ENDS]
            if not await self.post(ENDS_ROUTE, ends_to_dict(chunk), quiet=True):
                self.pending.add(chunk)
            else:
                self._taken()

    async def resend(self) -> None:
        """Send the kept ends again, oldest first, until the runtime refuses one request."""
        while len(self.pending):
            chunk = self.pending.oldest(MAX_ENDS)
            if not await self.post(ENDS_ROUTE, ends_to_dict(chunk), quiet=True):
                return
            self.pending.remove(chunk)
            self._taken()

    def _taken(self) -> None:
        if self._failing:
            log.info("runtime %s takes session ends again", self._label())
        self._failing = False
