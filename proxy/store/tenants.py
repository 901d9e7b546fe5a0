"""``TenantTables``: tenants and their API keys (``tenants``, ``api_keys``). Only a key's
SHA-256 and its first 8 characters are stored; the plaintext is returned once, at creation.
A key also holds its calls' default priority and the highest they may ask for, its tenant's
share weight, its rate limits (calls and tokens per minute) and whether the engine gets its
calls' prompts normalised (None: as the server says). proxy/callpath/auth.py checks keys
against them, ``talaria keys`` (talaria/cli/keys.py) manages them."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from talaria.core.protocol_calls import MAX_TENANT_WEIGHT
from talaria.core.types import Priority
from talaria.proxy.contract.calls import Caller, RateLimits, Share
from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import ApiKey, Tenant
from talaria.proxy.store.views import ApiKeyInfo

API_KEY_PREFIX = "tk-"
DELETED_KEY_HASH_PREFIX = "deleted:"
"""The ``key_hash`` of a deleted key is this plus its id: never a SHA-256 hex digest."""


def hash_key(plaintext: str) -> str:
    """The stored form of an API key: SHA-256, hex."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def key_share(priority: str = Priority.STANDARD, weight: float = 1.0) -> Share:
    """A key's defaults as a ``Share``: ``priority`` any case; ``ValueError`` naming the fault
    for an unknown priority or a weight outside (0, ``MAX_TENANT_WEIGHT``]."""
    try:
        known = Priority(priority.strip().lower())
    except ValueError:
        named = ", ".join(p.value for p in Priority)
        raise ValueError(f"unknown priority {priority!r}: use one of {named}") from None
    if not 0 < weight <= MAX_TENANT_WEIGHT:  # NaN is refused too
        raise ValueError(f"weight must be above 0 and at most {MAX_TENANT_WEIGHT:g} (got {weight})")
    return Share(known, float(weight))


def key_ceiling(priority: str, max_priority: str | None) -> Priority | None:
    """A key's ``--max-priority`` as given (any case): None (the key's own ``priority`` is
    its ceiling) or a class at least as high as ``priority``; ``ValueError`` naming the fault
    for an unknown class or one below the key's own (its default would pass its ceiling)."""
    if max_priority is None:
        return None
    ceiling = key_share(max_priority).priority
    own = key_share(priority).priority
    if ceiling.rank > own.rank:
        raise ValueError(
            f"max priority {ceiling.value!r} is below the key's own priority {own.value!r}: "
            "give a class at least as high, or leave it out"
        )
    return ceiling


MAX_RATE_LIMIT = 2**31 - 1
"""The largest ``--rpm`` or ``--tpm`` (``rpm``'s column is a 32-bit integer; ``tpm``'s is
64-bit since migration 0015, and keeps the same bound)."""


def key_limit(name: str, value: int | None) -> int | None:
    """A key's rate limit ``name`` (``rpm``, ``tpm``) as given: None (no limit) or a whole
    number in [1, :data:`MAX_RATE_LIMIT`]; ``ValueError`` naming the fault otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_RATE_LIMIT:
        raise ValueError(
            f"{name} must be a whole number from 1 to {MAX_RATE_LIMIT} (got {value!r}); "
            "leave it out for no limit"
        )
    return value


def _stored_priority(value: str | None) -> Priority | None:
    """A class as the store holds it; None for none, or one this version does not know."""
    try:
        return None if value is None else Priority(value)
    except ValueError:
        return None


class TenantTables(TableGroup):
    """Tenants by name; API keys created, looked up, listed, revoked and deleted."""

    async def create_tenant(self, name: str) -> str:
        """The id of the tenant called ``name``, created if there is none (idempotent)."""
        async with self._sessionmaker() as db:
            existing = await db.scalar(select(Tenant.id).where(Tenant.name == name))
            if existing is not None:
                return existing
            tenant_id = uuid.uuid4().hex
            db.add(Tenant(id=tenant_id, name=name, created_at=datetime.now(UTC)))
            try:
                await db.commit()
            except IntegrityError:  # created concurrently under the same name
                await db.rollback()
                raced = await db.scalar(select(Tenant.id).where(Tenant.name == name))
                if raced is None:
                    raise
                return raced
            return tenant_id

    async def create_api_key(
        self,
        tenant_id: str,
        *,
        priority: str = Priority.STANDARD,
        weight: float = 1.0,
        rpm: int | None = None,
        tpm: int | None = None,
        normalise_prompts: bool | None = None,
        max_priority: str | None = None,
    ) -> str:
        """A new key for ``tenant_id`` whose calls are ``priority`` unless a header asks
        another class no higher than ``max_priority`` (None: ``priority`` itself), its tenant
        weighing ``weight`` in the node's fair queue, limited to ``rpm`` calls and ``tpm``
        tokens a minute (None: not limited), its calls' prompts normalised for the engine or
        not (``normalise_prompts``; None: as the server says): the plaintext is returned here,
        once; only its hash is stored. ``ValueError`` if the tenant does not exist, or the
        priority, ceiling, weight or a limit is not one (:func:`key_share`,
        :func:`key_ceiling`, :func:`key_limit`)."""
        share = key_share(priority, weight)
        ceiling = key_ceiling(priority, max_priority)
        rpm, tpm = key_limit("rpm", rpm), key_limit("tpm", tpm)
        plaintext = API_KEY_PREFIX + secrets.token_urlsafe(32)
        async with self._sessionmaker() as db, db.begin():
            if await db.get(Tenant, tenant_id) is None:
                raise ValueError(f"no tenant with id {tenant_id!r}")
            db.add(
                ApiKey(
                    id=uuid.uuid4().hex,
                    tenant_id=tenant_id,
                    key_hash=hash_key(plaintext),
                    prefix=plaintext[:8],
                    created_at=datetime.now(UTC),
                    revoked_at=None,
                    priority=share.priority.value,
                    weight=share.weight,
                    rpm=rpm,
                    tpm=tpm,
                    normalise_prompts=normalise_prompts,
                    max_priority=None if ceiling is None else ceiling.value,
                )
            )
        return plaintext

    async def tenant_for_key(self, plaintext: str) -> str | None:
        """The tenant of an unrevoked key, or None."""
        caller = await self.caller_for_key(plaintext)
        return None if caller is None else caller.tenant_id

    async def caller_for_key(self, plaintext: str) -> Caller | None:
        """The caller of an unrevoked key: its tenant, with the key's priority and weight
        (a priority the store holds but this version does not know reads as ``standard``),
        its rate limits (None when it has neither), its prompt normalisation switch and its
        ceiling (None: its own priority; one this version does not know, or below its own
        priority, reads as None too: never a higher class than the key's); None if there is
        no such key."""
        columns = (ApiKey.id, ApiKey.tenant_id, ApiKey.priority, ApiKey.weight, ApiKey.rpm)
        query = select(*columns, ApiKey.tpm, ApiKey.normalise_prompts, ApiKey.max_priority)
        query = query.where(ApiKey.key_hash == hash_key(plaintext), ApiKey.revoked_at.is_(None))
        async with self._sessionmaker() as db:
            row = (await db.execute(query)).first()
        if row is None:
            return None
        key_id, tenant_id, priority, weight, rpm, tpm, normalise_prompts, max_priority = row
        known = _stored_priority(priority) or Priority.STANDARD
        ceiling = _stored_priority(max_priority)
        if ceiling is not None and ceiling.rank > known.rank:
            ceiling = None
        limits = None if rpm is None and tpm is None else RateLimits(key_id, rpm, tpm)
        share = Share(known, float(weight))
        return Caller(tenant_id, share, limits, normalise_prompts, ceiling)

    async def tenant_names(self) -> dict[str, str]:
        """Every tenant's name by its id."""
        async with self._sessionmaker() as db:
            rows = await db.execute(select(Tenant.id, Tenant.name))
        return {tenant_id: name for tenant_id, name in rows}

    async def list_api_keys(
        self, tenant_id: str | None = None, *, include_deleted: bool = False
    ) -> list[ApiKeyInfo]:
        """Keys (without secrets) with their tenant's name, oldest first, optionally of one
        tenant; deleted keys only with ``include_deleted`` (marked ``deleted``)."""
        query = (
            select(ApiKey, Tenant.name)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .order_by(ApiKey.created_at, ApiKey.id)
        )
        if tenant_id is not None:
            query = query.where(ApiKey.tenant_id == tenant_id)
        if not include_deleted:
            query = query.where(ApiKey.key_hash.not_like(DELETED_KEY_HASH_PREFIX + "%"))
        async with self._sessionmaker() as db:
            return [
                from_row(
                    ApiKeyInfo,
                    row,
                    tenant_name=name,
                    deleted=row.key_hash.startswith(DELETED_KEY_HASH_PREFIX),
                )
                for row, name in await db.execute(query)
            ]

    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke a key by id; False if there is no such key or it was already revoked."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(ApiKey, key_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = datetime.now(UTC)
            return True

    async def delete_api_key(self, key_id: str) -> bool:
        """Delete a key by id, as a tombstone: the row stays (revoked, its hash replaced by
        ``deleted:<id>``, which no key hashes to), so it still counts in
        :meth:`count_api_keys`. False if there is no such key or it was deleted already."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(ApiKey, key_id)
            if row is None or row.key_hash.startswith(DELETED_KEY_HASH_PREFIX):
                return False
            row.key_hash = DELETED_KEY_HASH_PREFIX + row.id
            if row.revoked_at is None:
                row.revoked_at = datetime.now(UTC)
            return True

    async def count_api_keys(self, *, active_only: bool = False) -> int:
        """How many keys were ever created, revoked and deleted ones included (so revoking or
        deleting the last key does not turn "no keys" open access back on); ``active_only``
        counts usable keys."""
        query = select(func.count()).select_from(ApiKey)
        if active_only:
            query = query.where(ApiKey.revoked_at.is_(None))
        async with self._sessionmaker() as db:
            return int(await db.scalar(query) or 0)
