"""The first claim of a session's name, decided by the store.

Each proxy replica keeps its live sessions in memory, and a session's row reaches the store
with its first call's records, after that call. So two replicas that got the first calls of
one (tenant, session id) at once each found nothing open in the store and opened a session of
their own: two sessions of one, their calls, records and KV split between them (issue 46: with
``TALARIA_REPLICA_AFFINITY=ingress`` while the balancer moves a session, or with rendezvous
while the replicas' live sets differ).

So a replica that does not hold the session a call names *claims* the name before it opens
one (proxy/cluster/handoff.py ``take_over``), in one transaction
(proxy/store/sessions.py ``open_root_session`` with ``claim``):

1. lock the name (:func:`lock_name`): on PostgreSQL the transaction's advisory lock on a
   64-bit digest of (tenant, session id), so claims of one name run one after the other and
   others are not held up (two names with one digest only wait for each other); on SQLite
   (one proxy only, so no race between replicas) its write lock, taken before the read;
2. the tenant's open root session of that name, if there is one, is the answer: the replica
   adopts it (the loser of a race adopts the winner's);
3. else the new session's row (:func:`claimed_row`, no calls counted) is inserted, under
   the key the replica then opens the session with, and committed as the lock is released:
   the next claim finds it. The batched writer later updates that row as any other
   (proxy/store/batch.py).

No schema change: the lock is on the name, not on a row (a unique index over open sessions'
(tenant_id, session_id) would need a migration). A claim whose call is then refused (a
route with no instance, say) leaves an open session with no call, which its replica holds and
serves on the next call; the sweep of stale sessions ends it otherwise
(proxy/edge/services.py).
"""

from __future__ import annotations

import hashlib

from sqlalchemy import false, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from talaria.proxy.contract.records import SessionRecord
from talaria.proxy.store.mapping import SESSION_COUNTERS, row_values
from talaria.proxy.store.models import SessionRow

LOCK_NAMESPACE = b"talaria.session-claim|"
"""Prefixed to the name before it is hashed: the lock's key space is the database's, shared
with whatever else takes advisory locks there."""


def name_lock_key(tenant_id: str, session_id: str) -> int:
    """The advisory lock's key of a name: blake2b with an 8-byte digest of namespace ‖
    len(tenant) ‖ ":" ‖ tenant ‖ session id (the length keeps (tenant, id) pairs apart), as a
    signed 64-bit integer (PostgreSQL's ``bigint``)."""
    tenant = tenant_id.encode()
    text = LOCK_NAMESPACE + str(len(tenant)).encode() + b":" + tenant + session_id.encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def lock_name(db: AsyncSession, tenant_id: str, session_id: str) -> None:
    """Hold the name's lock until ``db``'s transaction ends: PostgreSQL's advisory lock; on
    SQLite the database's write lock, taken by an UPDATE of no row before anything is read
    (a transaction that read first could insert after another's insert, not seeing it)."""
    if db.get_bind().dialect.name == "postgresql":
        key = name_lock_key(tenant_id, session_id)
        await db.execute(select(func.pg_advisory_xact_lock(key)))
    else:
        await db.execute(update(SessionRow).where(false()).values(state=SessionRow.state))


def claimed_row(claim: SessionRecord) -> SessionRow:
    """The row of a claimed session: its record's fields, no calls counted yet."""
    row = row_values(claim)
    row["session_id"] = claim.session_id or claim.session_key
    row.update(dict.fromkeys(SESSION_COUNTERS, 0))
    return SessionRow(**row)
