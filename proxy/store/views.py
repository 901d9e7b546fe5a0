"""What the store's reads return: small frozen dataclasses, detached from the database.

Calls, decisions, reservations, hints and instances come back as the records the gateway wrote
(``talaria.proxy.records``); sessions, pages and API keys have their own views here. Also the
opaque keyset cursor used by ``SqlStore.list_sessions``, and the row-to-view conversions.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from talaria.proxy.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    InstanceRecord,
    ReservationRecord,
)
from talaria.proxy.store.models import (
    ApiKey,
    CallRow,
    DecisionRow,
    HintRow,
    InstanceRow,
    ReservationRow,
    SessionRow,
    as_utc,
)


@dataclass(frozen=True)
class SessionSummary:
    """A session's row: identity, state, times and counters summed over its calls."""

    session_id: str
    """The proxy's key of the session."""
    tenant_id: str
    external_id: str
    """What the client calls it (the key, for an implicit session)."""
    identity_source: str | None
    parent_session_id: str | None
    model: str
    state: str
    started_at: datetime
    last_call_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    calls: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class SessionDetail:
    """A session with everything recorded about it, each list in time order."""

    session: SessionSummary
    calls: tuple[CallRecord, ...]
    decisions: tuple[DecisionRecord, ...]
    reservations: tuple[ReservationRecord, ...]
    hints: tuple[HintRecord, ...]
    children: tuple[SessionSummary, ...] = ()
    """Sessions whose parent this is (sub-agents, side conversations)."""


@dataclass(frozen=True)
class SessionPage:
    """One page of sessions, newest first; ``next_cursor`` is None on the last page."""

    items: tuple[SessionSummary, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class StoredResponseView:
    response_id: str
    response: dict[str, Any]
    input_items: list[Any]


@dataclass(frozen=True)
class DeadLetterView:
    """A record the database refused: its kind, its JSON and the error."""

    id: int
    created_at: datetime
    kind: str
    payload: str
    error: str


@dataclass(frozen=True)
class ApiKeyInfo:
    """An API key without its secret: the plaintext is shown once, at creation."""

    id: str
    tenant_id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    tenant_name: str = ""
    deleted: bool = False
    """Deleted keys are tombstones: their row stays (so "a key existed" is never forgotten),
    their hash is gone."""


_CURSOR_VERSION = 1


def encode_cursor(started_at: datetime, session_id: str) -> str:
    """The URL-safe cursor that resumes a listing after (started_at, session_id)."""
    payload = json.dumps([_CURSOR_VERSION, as_utc(started_at).isoformat(), session_id])
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (started_at, session_id) position in ``cursor``; ``ValueError`` if it is not one
    that :func:`encode_cursor` made."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        version, started_at, session_id = json.loads(raw)
        if version != _CURSOR_VERSION or not isinstance(session_id, str):
            raise ValueError("unknown cursor layout")
        return as_utc(datetime.fromisoformat(started_at)), session_id
    except (ValueError, TypeError, UnicodeError, binascii.Error) as exc:
        raise ValueError(
            f"invalid cursor {cursor!r}: pass the next_cursor of a previous page unchanged"
        ) from exc


# -- rows to views ----------------------------------------------------------------------


def session_view(row: SessionRow) -> SessionSummary:
    """A ``sessions`` row as a summary."""
    return SessionSummary(
        session_id=row.session_id,
        tenant_id=row.tenant_id,
        external_id=row.external_id,
        identity_source=row.identity_source,
        parent_session_id=row.parent_session_id,
        model=row.model,
        state=row.state,
        started_at=row.started_at,
        last_call_at=row.last_call_at,
        ended_at=row.ended_at,
        end_reason=row.end_reason,
        calls=row.calls,
        prompt_tokens=row.prompt_tokens,
        cached_tokens=row.cached_tokens,
        output_tokens=row.output_tokens,
    )


def call_view(row: CallRow) -> CallRecord:
    """A ``calls`` row as the record it was written from."""
    return CallRecord(
        request_id=row.request_id,
        session_id=row.session_id,
        call_index=row.call_index,
        model=row.model,
        instance=row.instance,
        arrived_at=row.arrived_at,
        finished_at=row.finished_at,
        status=row.status,
        queue_s=row.queue_s,
        slot_wait_s=row.slot_wait_s,
        prefill_s=row.prefill_s,
        decode_s=row.decode_s,
        engine_intake_s=row.engine_intake_s,
        engine_queue_s=row.engine_queue_s,
        engine_prefill_s=row.engine_prefill_s,
        engine_decode_s=row.engine_decode_s,
        prompt_tokens=row.prompt_tokens,
        cached_tokens=row.cached_tokens,
        output_tokens=row.output_tokens,
        finish_reason=row.finish_reason,
        kv_source=row.kv_source,
        stream=row.stream,
        tool_gap_hint_s=row.tool_gap_hint_s,
        error=row.error,
        api=row.api,
    )


def decision_view(row: DecisionRow) -> DecisionRecord:
    """A ``routing_decisions`` row as a record."""
    return DecisionRecord(
        request_id=row.request_id,
        session_id=row.session_id,
        router=row.router,
        instance=row.instance,
        reason=row.reason,
        scores=row.scores,
        created_at=row.created_at,
    )


def reservation_view(row: ReservationRow) -> ReservationRecord:
    """A ``reservations`` row as a record (released fields included)."""
    return ReservationRecord(
        reservation_id=row.reservation_id,
        session_id=row.session_id,
        instance=row.instance,
        held_bytes=row.held_bytes,
        created_at=row.created_at,
        expected_return_at=row.expected_return_at,
        expires_at=row.expires_at,
        released_at=row.released_at,
        release_reason=row.release_reason,
    )


def hint_view(row: HintRow) -> HintRecord:
    """A ``hints`` row as a record."""
    return HintRecord(
        session_id=row.session_id,
        at=row.at,
        expected_s=row.expected_s,
        tool=row.tool,
        kind=row.kind,
    )


def instance_view(row: InstanceRow) -> InstanceRecord:
    """A ``runtime_instances`` row as a record."""
    return InstanceRecord(
        name=row.name,
        kind=row.kind,
        url=row.url,
        models=list(row.models),
        last_seen_at=row.last_seen_at,
        status=dict(row.status),
    )


def key_view(row: ApiKey) -> ApiKeyInfo:
    """An ``api_keys`` row without its hash."""
    return ApiKeyInfo(
        id=row.id,
        tenant_id=row.tenant_id,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )
