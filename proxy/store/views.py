"""What the store's reads return: small frozen dataclasses, detached from the database.

Calls, decisions, reservations, hints and instances come back as the records the gateway wrote
(``talaria.proxy.contract.records``); sessions, pages, stored responses, dead letters and API
keys have their own views here, each field named as its row's column (``mapping.from_row`` fills a
view from a row by those names). Also the opaque keyset cursor used by
``SessionTables.list_sessions``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime

from talaria.proxy.contract.records import CallRecord, DecisionRecord, HintRecord, ReservationRecord
from talaria.proxy.store.models import as_utc


@dataclass(frozen=True)
class SessionSummary:
    """A session's row: identity, state, times and counters summed over its calls."""

    session_key: str
    """The proxy's key of the session (``ses_<hex>``)."""
    tenant_id: str
    session_id: str
    """What the client calls it (the key, for an implicit session)."""
    identity_source: str | None
    agent: str | None
    """The agent's kind (its ``User-Agent``'s product name, else ``identity_source``); None
    for a session recorded before migration 0014."""
    parent_session_key: str | None
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
class Family:
    """A root session with every session under it (its children, theirs, ...): how many,
    their calls and tokens summed, and the tree's completion time (``sct_s``: from the root's
    start to the last call or end of any of them)."""

    sessions: int
    calls: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    sct_s: float


@dataclass(frozen=True)
class SessionPage:
    """One page of sessions, newest first; ``next_cursor`` is None on the last page."""

    items: tuple[SessionSummary, ...]
    next_cursor: str | None


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
    priority: str = "standard"
    """Its calls' class unless a header asks another within ``max_priority``
    (``interactive``, ``standard``, ``batch``)."""
    weight: float = 1.0
    """Its tenant's share weight in the node's fair queue, in (0, 100]."""
    rpm: int | None = None
    """Calls per minute; None: no limit."""
    tpm: int | None = None
    """Prompt + output tokens per minute; None: no limit."""
    normalise_prompts: bool | None = None
    """Whether the engine gets its calls' prompts normalised; None: as the server says."""
    max_priority: str | None = None
    """The highest class its calls may ask for; None: its own ``priority``."""
    tenant_name: str = ""
    deleted: bool = False
    """Deleted keys are tombstones: their row stays (so "a key existed" is never forgotten),
    their hash is gone."""


_CURSOR_VERSION = 1


def encode_cursor(started_at: datetime, session_key: str) -> str:
    """The URL-safe cursor that resumes a listing after (started_at, session_key)."""
    payload = json.dumps([_CURSOR_VERSION, as_utc(started_at).isoformat(), session_key])
    return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (started_at, session_key) position in ``cursor``; ``ValueError`` if it is not one
    that :func:`encode_cursor` made."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        version, started_at, session_key = json.loads(raw)
        if version != _CURSOR_VERSION or not isinstance(session_key, str):
            raise ValueError("unknown cursor layout")
        return as_utc(datetime.fromisoformat(started_at)), session_key
    except (ValueError, TypeError, UnicodeError, binascii.Error) as exc:
        raise ValueError(
            f"invalid cursor {cursor!r}: pass the next_cursor of a previous page unchanged"
        ) from exc
