"""The storage quota of stored responses: bytes per tenant, and bytes in all.

**What counts.** A stored response counts ``stored_bytes``: the encoded size of every field of
its row, ``json_bytes(response) + json_bytes(input_items) + len(response_id) +
len(tenant_id) + len(session_key) + len(model) + 16`` (UTF-8 lengths; 8 bytes per timestamp).
``json_bytes`` is the length of the compact JSON text with non-ASCII escaped, as the store
writes it (within a few percent of the database's own encoding). A continuation's row holds
the whole chain's input items again, so it counts them again: that is the disk it takes.

**The rule.** A ``store: true`` call is admitted (:meth:`StorageQuota.reserve`) only if
``used(tenant) + held(tenant) + estimate ≤ tenant_quota`` and ``used_all + held_all +
estimate ≤ max_bytes``; else 429 ``storage_quota_exceeded``. ``estimate`` is the response
without its output (its input items and the request's fields it echoes); ``held`` are the
estimates of the tenant's admitted calls still running. When the call's record is made
(:meth:`settle`) its estimate is replaced by its exact size, which adds the output: a tenant
can pass its quota by at most the output items of its calls in flight. A call that fails
stores nothing and its estimate is released (:meth:`release`).

**Where ``used`` comes from.** The store is the truth; replicas share it. ``used(t) =
base(t) + local(t)``: ``base`` is the store's ``SUM(size_bytes)`` per tenant over the rows not
expired, read at start and again every :data:`REFRESH_S` (:meth:`begin_refresh`, then the
writer's flush, the query, :meth:`finish_refresh`); ``local`` is what this process stored
(+) and deleted (−) since. Accuracy:

- one proxy: exact, except that a response counts until the first refresh after its expiry
  (≤ ``REFRESH_S`` late), and a deletion that completes while a refresh runs is subtracted
  once more, until the next one;
- R replicas: each sees the others' additions at its next refresh, so a tenant can pass its
  quota by what the other R − 1 replicas store for it within ``REFRESH_S`` (plus the output
  of calls in flight, as above); additions made while a refresh runs may count twice until
  the next one (an over-count: they are refused earlier, never later).

**Retry-After** of the 429: until the tenant's oldest stored response expires (for the global
cap: the oldest of all), as of the last refresh and this process's additions, at least
``REFRESH_S``; deleting stored responses frees quota at once.

Memory: one entry per tenant with stored responses or calls in flight, plus one per response
stored since the last refresh.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from talaria.proxy.contract.errors import ApiError

REFRESH_S = 10.0
"""How often the totals are read again from the store (wall seconds): how late one replica
sees another's additions and any expiry. The query reads only an index, per tenant one
group; once per 10 s it costs nothing next to the calls that fill a quota."""
TIMESTAMP_BYTES = 8


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (non-ASCII escaped, so characters are bytes)."""
    return len(json.dumps(value, separators=(",", ":")))


def stored_bytes(
    response: Any, input_bytes: int, response_id: str, tenant_id: str, session_key: str, model: str
) -> int:
    """What a stored response counts (the module docstring), its input items already
    measured (``input_bytes = json_bytes(input_items)``)."""
    strings = (response_id, tenant_id, session_key, model)
    return (
        json_bytes(response)
        + input_bytes
        + sum(len(s.encode()) for s in strings)
        + 2 * TIMESTAMP_BYTES
    )


@dataclass
class Hold:
    """The estimate of an admitted call, held until it is settled or released."""

    tenant_id: str
    nbytes: int
    open: bool = True


@dataclass(frozen=True)
class _Added:
    """A response this process stored since the last refresh."""

    seq: int
    tenant_id: str
    nbytes: int
    expires_at: datetime


class StorageQuota:
    """Bytes of stored responses per tenant and in all (see the module docstring). Clock-free:
    every method that needs the time takes ``now``."""

    def __init__(self, tenant_quota_bytes: int, max_bytes: int) -> None:
        self.tenant_quota_bytes = tenant_quota_bytes
        self.max_bytes = max_bytes
        self._base: dict[str, int] = {}
        self._oldest: dict[str, datetime] = {}
        """Per tenant, the earliest expiry of a counted response (for Retry-After)."""
        self._added: OrderedDict[str, _Added] = OrderedDict()
        """By response id, in the order stored, which is the order of expiry (one TTL)."""
        self._local: dict[str, int] = {}
        """Per tenant, bytes added minus bytes deleted since the last refresh."""
        self._held: dict[str, int] = {}
        self._seq = 0

    # -- reading ----------------------------------------------------------------------------
    def used(self, tenant_id: str, now: datetime) -> int:
        """Bytes the tenant's stored responses take (settled ones; not the estimates held)."""
        self._expire(now)
        return max(0, self._base.get(tenant_id, 0) + self._local.get(tenant_id, 0))

    def used_all(self, now: datetime) -> int:
        """Bytes all tenants' stored responses take (settled ones; not the estimates held)."""
        self._expire(now)
        return max(0, sum(self._base.values()) + sum(self._local.values()))

    def held(self, tenant_id: str | None = None) -> int:
        """Estimates held for calls in flight: the tenant's, or everyone's (None)."""
        if tenant_id is None:
            return sum(self._held.values())
        return self._held.get(tenant_id, 0)

    # -- a call's bytes ---------------------------------------------------------------------
    def reserve(self, tenant_id: str, nbytes: int, now: datetime) -> Hold:
        """Admit a ``store: true`` call whose response takes about ``nbytes``; 429 when it
        would pass the tenant's quota or the global cap."""
        if self.used(tenant_id, now) + self.held(tenant_id) + nbytes > self.tenant_quota_bytes:
            raise self._refusal(
                f"this tenant's stored responses may take {self.tenant_quota_bytes} bytes",
                self._oldest.get(tenant_id),
                now,
            )
        if self.used_all(now) + self.held() + nbytes > self.max_bytes:
            oldest = min(self._oldest.values(), default=None)
            raise self._refusal(
                f"the server's stored responses may take {self.max_bytes} bytes", oldest, now
            )
        _add(self._held, tenant_id, nbytes)
        return Hold(tenant_id, nbytes)

    def settle(self, hold: Hold, response_id: str, nbytes: int, expires_at: datetime) -> None:
        """The call's response is stored with ``nbytes``: it counts instead of the estimate,
        until ``expires_at``."""
        self.release(hold)
        self._seq += 1
        self._added[response_id] = _Added(self._seq, hold.tenant_id, nbytes, expires_at)
        _add(self._local, hold.tenant_id, nbytes)
        self._older(hold.tenant_id, expires_at)

    def release(self, hold: Hold) -> None:
        """Drop the estimate (idempotent): settled, or the call stored nothing."""
        if hold.open:
            hold.open = False
            _add(self._held, hold.tenant_id, -hold.nbytes)

    def freed(self, tenant_id: str, response_id: str, nbytes: int) -> None:
        """The tenant's stored response ``response_id`` of ``nbytes`` was deleted."""
        added = self._added.pop(response_id, None)
        _add(self._local, tenant_id, -(added.nbytes if added is not None else nbytes))

    # -- refreshing from the store ----------------------------------------------------------
    def begin_refresh(self) -> int:
        """Call before flushing the writer; pass the result to :meth:`finish_refresh`."""
        return self._seq

    def finish_refresh(self, mark: int, totals: dict[str, tuple[int, datetime]]) -> None:
        """``totals``: the store's (bytes, earliest expiry) per tenant, read after the
        writer was flushed. The additions made up to ``mark`` are in them, so they stop
        counting locally; so do all deletions made until now (those made during the refresh
        may be in them or not: dropping them can only over-count)."""
        self._base = {tenant: total for tenant, (total, _) in totals.items()}
        self._oldest = {tenant: oldest for tenant, (_, oldest) in totals.items()}
        self._added = OrderedDict((k, a) for k, a in self._added.items() if a.seq > mark)
        self._local = {}
        for added in self._added.values():
            _add(self._local, added.tenant_id, added.nbytes)
            self._older(added.tenant_id, added.expires_at)

    # -- internals --------------------------------------------------------------------------
    def _older(self, tenant_id: str, expires_at: datetime) -> None:
        oldest = self._oldest.get(tenant_id)
        if oldest is None or expires_at < oldest:
            self._oldest[tenant_id] = expires_at

    def _expire(self, now: datetime) -> None:
        """Additions past their expiry stop counting."""
        while self._added:
            key, head = next(iter(self._added.items()))
            if head.expires_at > now:
                return
            del self._added[key]
            _add(self._local, head.tenant_id, -head.nbytes)

    def _refusal(self, what: str, oldest: datetime | None, now: datetime) -> ApiError:
        wait_s = REFRESH_S if oldest is None else (oldest - now) / timedelta(seconds=1)
        return ApiError(
            429,
            f"Storage quota exceeded: {what}. Delete stored responses (DELETE "
            "/v1/responses/{id}), wait for them to expire, or send store: false.",
            type="rate_limit_error",
            code="storage_quota_exceeded",
            param="store",
            retry_after_s=max(REFRESH_S, wait_s),
        )


def _add(counts: dict[str, int], key: str, delta: int) -> None:
    """``counts[key] += delta``, the entry removed at 0 (so the dict stays small)."""
    value = counts.get(key, 0) + delta
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)
