"""The session store's tables, as SQLAlchemy 2.0 declarative models.

The schema itself is created by the hand-written Alembic migrations (``migrations/versions``);
these models must match them exactly (a test compares the migrated schema with this metadata).

Every timestamp is a :class:`UTCDateTime`: ``DateTime(timezone=True)`` that is stored as UTC and
always read back as an aware UTC ``datetime``, also on SQLite, which keeps no zone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime; a naive one is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that binds and returns aware UTC datetimes on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """``value`` in UTC as the backend stores it (naive on SQLite)."""
        if value is None:
            return None
        value = as_utc(value)
        # SQLite stores text without a zone: bind naive UTC so values sort as they compare.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The stored value as an aware UTC datetime."""
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    """Declarative base; its metadata (with stable constraint names) is Alembic's target."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON,
        list[str]: JSON,
    }


class Tenant(Base):
    """A tenant: the owner of API keys, sessions and stored responses; ``name`` is unique."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    created_at: Mapped[datetime]


class ApiKey(Base):
    """An API key: only the SHA-256 hex of the plaintext is kept, plus its first 8 characters;
    with the priority its calls get unless a header asks a lower one, the highest a header may
    ask (``max_priority``) and its tenant's share weight in the node's fair queue (``talaria
    keys create --priority --max-priority --weight``), its rate limits (``--rpm --tpm``) and
    its prompt normalisation switch."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String, unique=True)
    prefix: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    priority: Mapped[str] = mapped_column(String, server_default="standard")
    weight: Mapped[float] = mapped_column(Float, server_default=text("1.0"))
    rpm: Mapped[int | None] = mapped_column(Integer)
    """Calls per minute (``--rpm``); None: no limit."""
    tpm: Mapped[int | None] = mapped_column(BigInteger)
    """Prompt + output tokens per minute (``--tpm``); None: no limit."""
    normalise_prompts: Mapped[bool | None] = mapped_column(Boolean)
    """Whether the engine gets its calls' prompts normalised (``--normalise-prompts`` /
    ``--no-normalise-prompts``); None: as ``TALARIA_NORMALISE_PROMPTS`` says."""
    max_priority: Mapped[str | None] = mapped_column(String)
    """The highest class its calls' ``X-Talaria-Priority`` may ask (``--max-priority``);
    None: its own ``priority``."""


class KeyUsage(Base):
    """A rate-limited key's calls and tokens in one minute (``window_start``, UTC), summed over
    the replicas: each adds its own counts every ``TALARIA_RATE_SYNC_S`` (proxy/store/usage.py);
    rows of past minutes are deleted."""

    __tablename__ = "key_usage"

    key_id: Mapped[str] = mapped_column(String, primary_key=True)
    window_start: Mapped[datetime] = mapped_column(primary_key=True)
    requests: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)


class SessionRow(Base):
    """One agent session, with counters summed over its calls. ``session_key`` is the proxy's
    key (``ses_<hex>``, unique across tenants); ``session_id`` is what the client calls the
    session (the key itself for an implicit session), unique per tenant among live sessions
    only: a client may reuse an id after its session ended. ``parent_session_key`` is the
    parent's key, a session of the same tenant (older rows may hold an id a client gave:
    the admin views join a parent by key *and* tenant, proxy/store/sessions.py)."""

    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_tenant_id_session_id", "tenant_id", "session_id"),)

    session_key: Mapped[str] = mapped_column(String, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String, index=True)
    session_id: Mapped[str] = mapped_column(String)
    identity_source: Mapped[str | None] = mapped_column(String)
    agent: Mapped[str | None] = mapped_column(String)
    parent_session_key: Mapped[str | None] = mapped_column(String, index=True)
    model: Mapped[str] = mapped_column(String)
    state: Mapped[str] = mapped_column(String)
    started_at: Mapped[datetime] = mapped_column(index=True)
    last_call_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String)
    calls: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)


class CallRow(Base):
    """One model call (a ``CallRecord``: a column per field, proxy/store/mapping.py). The
    (session_key, call_index) index is unique (a session's calls are numbered without a
    repeat: proxy/store/call_numbers.py) and also serves lookups by session_key alone, so
    there is no separate index on it."""

    __tablename__ = "calls"
    __table_args__ = (
        Index("ix_calls_session_key_call_index", "session_key", "call_index", unique=True),
    )

    request_id: Mapped[str] = mapped_column(String, primary_key=True)
    session_key: Mapped[str] = mapped_column(ForeignKey("sessions.session_key"))
    call_index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String)
    instance: Mapped[str | None] = mapped_column(String)
    arrived_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(String)
    queue_s: Mapped[float | None] = mapped_column(Float)
    slot_wait_s: Mapped[float | None] = mapped_column(Float)
    prefill_s: Mapped[float | None] = mapped_column(Float)
    decode_s: Mapped[float | None] = mapped_column(Float)
    engine_intake_s: Mapped[float | None] = mapped_column(Float)
    engine_queue_s: Mapped[float | None] = mapped_column(Float)
    engine_prefill_s: Mapped[float | None] = mapped_column(Float)
    engine_decode_s: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    finish_reason: Mapped[str | None] = mapped_column(String)
    kv_source: Mapped[str | None] = mapped_column(String)
    stream: Mapped[bool] = mapped_column(Boolean)
    tool_gap_hint_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    api: Mapped[str | None] = mapped_column(String)
    how: Mapped[str | None] = mapped_column(String)
    thread: Mapped[int | None] = mapped_column(Integer)
    drift_at: Mapped[int | None] = mapped_column(Integer)
    normalised: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    priority_asked: Mapped[str | None] = mapped_column(String)
    priority_served: Mapped[str | None] = mapped_column(String)


class DecisionRow(Base):
    """One routing decision, with every candidate's scores."""

    __tablename__ = "routing_decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String, index=True)
    session_key: Mapped[str] = mapped_column(String, index=True)
    router: Mapped[str] = mapped_column(String)
    instance: Mapped[str | None] = mapped_column(String)
    reason: Mapped[str] = mapped_column(String, index=True)
    scores: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class ReservationRow(Base):
    """A soft KV reservation; the release fields are filled in when it is written again."""

    __tablename__ = "reservations"

    reservation_id: Mapped[str] = mapped_column(String, primary_key=True)
    session_key: Mapped[str] = mapped_column(String, index=True)
    instance: Mapped[str] = mapped_column(String)
    held_bytes: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime]
    expected_return_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    released_at: Mapped[datetime | None]
    release_reason: Mapped[str | None] = mapped_column(String)


class HintRow(Base):
    """A client hint (expected tool gap, or the end of the session)."""

    __tablename__ = "hints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_key: Mapped[str] = mapped_column(String, index=True)
    at: Mapped[datetime]
    expected_s: Mapped[float | None] = mapped_column(Float)
    tool: Mapped[str | None] = mapped_column(String)
    kind: Mapped[str] = mapped_column(String)


class InstanceRow(Base):
    """A runtime instance as last seen by the gateway."""

    __tablename__ = "runtime_instances"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    kind: Mapped[str] = mapped_column(String)
    url: Mapped[str | None] = mapped_column(String)
    models: Mapped[list[str]]
    last_seen_at: Mapped[datetime]
    status: Mapped[dict[str, Any]]


class DeadLetter(Base):
    """A record the database refused for its content (e.g. a NUL byte PostgreSQL cannot
    store), kept here as JSON text (non-ASCII escaped) instead of blocking the records
    behind it (proxy/store/deadletters.py)."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(index=True)
    kind: Mapped[str] = mapped_column(String)
    payload: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)


class ReplicaRow(Base):
    """A proxy replica sharing this database: where its peers reach it, and its heartbeat
    (proxy/cluster/membership.py). Live while ``last_seen_at`` is recent."""

    __tablename__ = "proxy_replicas"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    url: Mapped[str] = mapped_column(String)
    started_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]


class DrainRow(Base):
    """A runtime instance being drained: no new calls are routed to it (by any replica); its
    running calls finish. Deleting the row puts it back."""

    __tablename__ = "instance_drains"

    name: Mapped[str] = mapped_column(String, primary_key=True)
    since: Mapped[datetime]
