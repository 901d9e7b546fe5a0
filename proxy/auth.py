"""API keys: from ``TALARIA_API_KEYS`` (tenant "default") or hashed in the store (their tenant).

With no key configured anywhere the proxy serves local callers (loopback) with any key, and says
so at start; remote callers then get 401. With keys configured every call needs one.
"""

from __future__ import annotations

import time

from talaria.proxy.errors import unauthorized
from talaria.proxy.store.repository import SqlStore, hash_key

LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
CACHE_TTL_S = 30.0
"""How long a looked-up store key is trusted before asking the store again (revocations
take effect within this time)."""


class Authenticator:
    def __init__(self, env_keys: list[str], store: SqlStore, store_keys: int) -> None:
        self._env = {hash_key(k) for k in env_keys}
        self._store = store
        self.open = not env_keys and store_keys == 0
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def tenant(self, authorization: str | None, client_host: str | None) -> str:
        """The caller's tenant id, or raise a 401 ``ApiError``."""
        if self.open:
            if client_host in LOCAL_HOSTS:
                return "local"
            raise unauthorized("No API keys are configured, so only local callers are served.")
        key = _bearer(authorization)
        if key is None:
            raise unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
        digest = hash_key(key)
        if digest in self._env:
            return "default"
        cached = self._cache.get(digest)
        now = time.monotonic()
        if cached is None or now - cached[1] > CACHE_TTL_S:
            cached = (await self._store.tenant_for_key(key), now)
            self._cache[digest] = cached
        if cached[0] is None:
            raise unauthorized()
        return cached[0]


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
