"""API keys: from ``TALARIA_API_KEYS`` (tenant "default") or hashed in the store (their tenant,
with the key's priority, weight and rate limits: a ``Caller``).

Key mode, read live. While no key exists the proxy is *open*: it serves loopback callers with
any key (tenant "local"), or every caller with ``allow_open`` (``--allow-open``). Whether a key
exists is read again from the store at most every :data:`MODE_TTL_S` while open, and once a key
has been seen the proxy is *closed* for good in this process: every call needs a key. Revoked
and deleted keys count (``talaria keys delete`` leaves a tombstone), so revoking or deleting the
last key never reopens the proxy, not even after a restart; only ``allow_open`` does, at start,
when no key is usable. ``TALARIA_API_KEYS`` closes it from the start.

Store lookups are cached in two bounded LRUs (valid keys, invalid keys), each entry trusted for
:data:`CACHE_TTL_S`. When the store cannot be read, a key seen valid before is still accepted
(even after its TTL), a key seen invalid still gets 401, and any other key gets 503 with
``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar

from talaria.proxy.contract.calls import Caller
from talaria.proxy.contract.errors import ApiError, unauthorized
from talaria.proxy.store.tenants import hash_key

log = logging.getLogger("talaria.proxy.callpath.auth")
V = TypeVar("V")

LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
LOCAL = Caller("local")
"""The caller in open mode: tenant ``local``, ``standard``, weight 1."""
ENV = Caller("default")
"""The caller of a ``TALARIA_API_KEYS`` key: tenant ``default``, ``standard``, weight 1."""
CACHE_TTL_S = 30.0
"""How long a looked-up store key is trusted before asking the store again (revocations
take effect within this time)."""
MODE_TTL_S = 2.0
"""While the proxy is open (no key seen yet), how often it asks the store again whether a key
exists: a key created while the proxy runs is enforced within this time."""
VALID_CACHE_SIZE = 100_000
"""Most valid keys remembered (least recently used dropped first)."""
INVALID_CACHE_SIZE = 10_000
"""Most invalid keys remembered, apart from the valid ones: a flood of wrong keys can neither
grow memory without bound nor push valid keys out."""
STORE_RETRY_AFTER_S = 2.0
"""``Retry-After`` of the 503 an unknown key gets while the store cannot be read."""


class KeyStore(Protocol):
    """What the authenticator needs of the store (``TenantTables`` has it)."""

    async def caller_for_key(self, plaintext: str) -> Caller | None:
        """The caller of an unrevoked key (its tenant, priority and weight), or None."""
        ...

    async def count_api_keys(self, *, active_only: bool = False) -> int:
        """Keys ever created (revoked and deleted ones included); ``active_only``: usable
        keys only."""
        ...


class Authenticator:
    """The tenant of each call, from its key (see the module's docstring).

    ``mode_ttl_s`` and ``cache_ttl_s`` default to :data:`MODE_TTL_S` and :data:`CACHE_TTL_S`
    (read when the authenticator is made); ``clock`` gives seconds (``time.monotonic``).
    """

    def __init__(
        self,
        env_keys: list[str],
        store: KeyStore,
        *,
        allow_open: bool = False,
        metrics_token: str | None = None,
        mode_ttl_s: float | None = None,
        cache_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        valid_cache_size: int = VALID_CACHE_SIZE,
        invalid_cache_size: int = INVALID_CACHE_SIZE,
    ) -> None:
        self._env = {hash_key(k) for k in env_keys}
        self._store = store
        self._allow_open = allow_open
        self._metrics_token = metrics_token
        self._mode_ttl_s = MODE_TTL_S if mode_ttl_s is None else mode_ttl_s
        self._cache_ttl_s = CACHE_TTL_S if cache_ttl_s is None else cache_ttl_s
        self._clock = clock
        # None: not read yet; True: no key (open); False: closed for good.
        self._open: bool | None = False if env_keys else None
        self._mode_read_at: float | None = None
        self._mode_lock = asyncio.Lock()
        self._mode_failing = False
        self._lookup_failing = False
        self._valid: OrderedDict[str, tuple[Caller, float]] = OrderedDict()
        self._invalid: OrderedDict[str, float] = OrderedDict()
        self._valid_size = valid_cache_size
        self._invalid_size = invalid_cache_size

    @property
    def open(self) -> bool:
        """Whether no key exists (as last read): callers are then served without one."""
        return self._open is True

    @property
    def cached_keys(self) -> tuple[int, int]:
        """How many (valid, invalid) keys the caches hold."""
        return len(self._valid), len(self._invalid)

    async def start(self) -> None:
        """Read the key mode now and say at start how callers will be served."""
        await self._refresh_mode()
        if self._open is None:
            log.warning("cannot read API keys from the store: calls get 503 until it answers")
        elif self._open and self._allow_open:
            log.warning("no API keys (--allow-open): serving every caller without a key")
        elif self._open:
            log.warning("no API keys configured: serving local callers with any key")
        elif not self._env and await self._no_usable_key():
            log.warning(
                "every API key is revoked or deleted: serving nobody until a key is created "
                "('talaria keys create') or the proxy restarts with --allow-open"
            )

    async def tenant(self, authorization: str | None, client_host: str | None) -> str:
        """The caller's tenant id, or raise a 401 (or, store down, 503) ``ApiError``."""
        return (await self.caller(authorization, client_host)).tenant_id

    async def caller(self, authorization: str | None, client_host: str | None) -> Caller:
        """The caller (its tenant, its key's priority, weight and rate limits), or raise a 401
        (or, store down, 503) ``ApiError``."""
        if await self._is_open():
            if self._allow_open or client_host in LOCAL_HOSTS:
                return LOCAL
            raise unauthorized(
                "No API keys are configured, so only local callers are served "
                "(create one with 'talaria keys create', or start with --allow-open)."
            )
        key = _bearer(authorization)
        if key is None:
            raise unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
        digest = hash_key(key)
        if digest in self._env:
            return ENV
        return await self._store_caller(key, digest)

    def check_metrics(self, authorization: str | None) -> None:
        """Raise a 401 unless ``authorization`` carries the metrics token (when one is set)."""
        if self._metrics_token is None:
            return
        given = _bearer(authorization)
        if given is None or not hmac.compare_digest(given.encode(), self._metrics_token.encode()):
            raise unauthorized("Metrics token required: send 'Authorization: Bearer <token>'.")

    # -- key mode -------------------------------------------------------------------------

    async def _is_open(self) -> bool:
        if self._open is False:
            return False
        if self._mode_read_at is None or self._clock() - self._mode_read_at >= self._mode_ttl_s:
            async with self._mode_lock:  # one read for all the calls that find it stale
                read_at = self._mode_read_at
                if read_at is None or self._clock() - read_at >= self._mode_ttl_s:
                    await self._refresh_mode()
        if self._open is None:
            raise _store_unavailable()
        return self._open

    async def _refresh_mode(self) -> None:
        """Ask the store whether a key exists; keep the previous mode if it cannot answer."""
        if self._open is False:
            return
        self._mode_read_at = self._clock()
        try:
            # With allow_open the operator accepts serving everyone while no key is usable;
            # without it, a key that ever existed (revoked, deleted) keeps the proxy closed.
            count = await self._store.count_api_keys(active_only=self._allow_open)
        except Exception as exc:
            if not self._mode_failing:
                log.warning("cannot read the API key mode from the store: %r", exc)
                self._mode_failing = True
            return
        if self._mode_failing:
            log.warning("the store answers again: API key mode read")
            self._mode_failing = False
        if count > 0:
            if self._open:
                log.warning("an API key exists now: every call needs a key from now on")
            self._open = False
        else:
            self._open = True

    async def _no_usable_key(self) -> bool:
        try:
            return await self._store.count_api_keys(active_only=True) == 0
        except Exception:
            return False

    # -- store keys -----------------------------------------------------------------------

    async def _store_caller(self, key: str, digest: str) -> Caller:
        now = self._clock()
        valid = self._valid.get(digest)
        if valid is not None and now - valid[1] <= self._cache_ttl_s:
            self._valid.move_to_end(digest)
            return valid[0]
        invalid_at = self._invalid.get(digest)
        if invalid_at is not None and now - invalid_at <= self._cache_ttl_s:
            self._invalid.move_to_end(digest)
            raise unauthorized()
        try:
            caller = await self._store.caller_for_key(key)
        except Exception as exc:
            if not self._lookup_failing:
                log.warning("cannot look API keys up in the store: %r", exc)
                self._lookup_failing = True
            if valid is not None:  # seen valid before: keep serving it while the store is down
                self._valid.move_to_end(digest)
                return valid[0]
            if invalid_at is not None:
                raise unauthorized() from None
            raise _store_unavailable() from None
        if self._lookup_failing:
            log.warning("the store answers key lookups again")
            self._lookup_failing = False
        if caller is None:
            self._valid.pop(digest, None)
            _remember(self._invalid, digest, now, self._invalid_size)
            raise unauthorized()
        self._invalid.pop(digest, None)
        _remember(self._valid, digest, (caller, now), self._valid_size)
        return caller


def _remember(cache: OrderedDict[str, V], digest: str, value: V, size: int) -> None:
    cache[digest] = value
    cache.move_to_end(digest)
    while len(cache) > size:
        cache.popitem(last=False)


def _store_unavailable() -> ApiError:
    return ApiError(
        503,
        "API keys cannot be checked: the store is unavailable. Retry shortly.",
        type="server_error",
        code="store_unavailable",
        retry_after_s=STORE_RETRY_AFTER_S,
    )


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
