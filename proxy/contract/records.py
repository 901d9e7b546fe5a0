"""What the gateway persists, as plain records. The hot path builds them and hands them to the
store's batched writer; the store turns them into rows (proxy/store/).

A session is named by ``session_key``, the proxy's key (``ses_<hex>``); ``session_id`` is
only ever the client's id of it. Each field is stored in the column of the same name of its
record's row (proxy/store/models.py; ``mapping.record_rows`` pairs them), and read back into
the record by that name: a new stored field is declared here and in the row (plus a
migration), nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar


@dataclass(frozen=True)
class SessionRecord:
    """Upserted on every call: created on the first, counters and times moved on later ones."""

    session_key: str
    """The proxy's key of the session (``ses_<hex>``)."""
    tenant_id: str
    model: str
    started_at: datetime
    last_call_at: datetime
    parent_session_key: str | None = None
    state: str = "active"  # active | in_tool | ended
    ended_at: datetime | None = None
    end_reason: str | None = None  # client | final | admin | idle
    session_id: str | None = None
    """The client's id of the session (None: the same as ``session_key``)."""
    identity_source: str | None = None
    """Where that id came from (proxy/sessions/identity.py), or "implicit"."""
    agent: str | None = None
    """The agent's kind (proxy/sessions/identity.py ``agent_kind``: its ``User-Agent``'s
    product name, else ``identity_source``)."""


@dataclass(frozen=True)
class CallRecord:
    """One model call, written when it ends (ok or error); written again (a retried batch,
    same ``request_id``) its tokens still count towards its session's once."""

    request_id: str
    session_key: str
    call_index: int
    model: str
    instance: str | None
    arrived_at: datetime
    finished_at: datetime | None
    status: str  # ok | error
    queue_s: float | None = None
    slot_wait_s: float | None = None
    """Wall seconds of ``queue_s`` spent waiting for a slot of the call's model (the switch into
    it included; ``CallResult.slot_wait_s``); the rest waited for room inside that slot."""
    prefill_s: float | None = None  # admission → first token (includes KV restore)
    decode_s: float | None = None  # first token → last token
    engine_intake_s: float | None = None
    """Wall seconds from admission until the engine queued the call; this and the next three
    are the engine's own timing (``core.types.EngineTimes``), None where it keeps none."""
    engine_queue_s: float | None = None  # queued in the engine → first scheduled
    engine_prefill_s: float | None = None  # scheduled → the engine's first-token output
    engine_decode_s: float | None = None  # the engine's first-token → last-token outputs
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None  # stop | length | tool_calls
    kv_source: str | None = None  # new | hbm | host | recompute
    stream: bool = False
    tool_gap_hint_s: float | None = None
    error: str | None = None
    api: str | None = None  # chat | completions | messages | responses
    how: str | None = None
    """How the call's session was found (proxy/sessions/index.py ``How``: new, continued,
    retry, corrected, thread, compacted, child, adopted)."""
    thread: int | None = None
    """The session's thread the call ran in (0: its first conversation)."""
    drift_at: int | None = None
    """For a ``drifted`` call, the first message of the thread's prompt it rewrote (the KV of
    the messages from there on could not be reused: proxy/sessions/drift.py)."""
    normalised: list[str] | None = None
    """The volatile parts taken out of its system text before its session was found, and
    (unless the switch was off for it) before the engine got it: the names of
    proxy/sessions/normalise.py's rows (``claude-code-attribution``, ``operator-<n>``); None:
    none."""
    priority_asked: str | None = None
    """The class its ``X-Talaria-Priority`` header asked (None: it sent none)."""
    priority_served: str | None = None
    """The class it was sent to the node in: the asked one within its key's ceiling, else
    the key's own (``Caller.served``); None for a call recorded before migration 0015."""


@dataclass(frozen=True)
class DecisionRecord:
    """One routing decision: where a call went, why, and every candidate's scores."""

    request_id: str
    session_key: str
    router: str
    instance: str | None
    reason: str
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    """instance → scorer → score in [0, 1] (plus "total")."""
    created_at: datetime | None = None


@dataclass(frozen=True)
class ReservationRecord:
    """A session thread's route preference (the store's name: a reservation row). Inserted
    when taken; the same id is written again when released."""

    reservation_id: str
    session_key: str
    instance: str
    held_bytes: float
    created_at: datetime
    expected_return_at: datetime
    expires_at: datetime
    released_at: datetime | None = None
    release_reason: str | None = None  # returned | replaced | ended | expired | retired


@dataclass(frozen=True)
class HintRecord:
    """A client hint: the expected gap of a tool call (``expected_s``), or the session's end."""

    session_key: str
    at: datetime
    expected_s: float | None
    tool: str | None = None
    kind: str = "tool_gap"  # tool_gap | end


@dataclass(frozen=True)
class InstanceRecord:
    """A runtime instance as the gateway saw it (written at start; upserted by name)."""

    name: str
    kind: str  # in-process | http
    url: str | None
    models: list[str]
    last_seen_at: datetime
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TableRecord:
    """A record of a table a dialect keeps in the store (its own folder declares the table:
    proxy/dialects/responses/tables.py). The class says where it goes: ``ROW``, the
    SQLAlchemy model of its rows (on proxy/store/models.py ``Base``); ``KEY``, the field that
    keys them; ``OWNER``, the field of the tenant that owns one. The batched writer upserts it
    by key within its owner, every field replaced (proxy/store/batch.py)."""

    ROW: ClassVar[Any]
    KEY: ClassVar[str]
    OWNER: ClassVar[str]


Record = (
    SessionRecord
    | CallRecord
    | DecisionRecord
    | ReservationRecord
    | HintRecord
    | InstanceRecord
    | TableRecord
)
