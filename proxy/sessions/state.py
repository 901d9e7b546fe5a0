"""A live session as this replica holds it (``SessionState``), its conversations
(``Thread``), and what resolving a call found (``Resolution``): the book's records
(book.py keeps them; index.py finds threads; resolve.py says which a call belongs to)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from talaria.proxy.contract.records import ReservationRecord
from talaria.proxy.sessions.index import How, IndexKey, Kind


def split_runtime_key(key: str) -> tuple[str, int]:
    """(session key, thread) of a runtime key (``SessionState.runtime_key``'s inverse)."""
    session, _, thread = key.partition("/")
    return session, int(thread) if thread.isdigit() else 0


def new_key() -> str:
    """A fresh internal session key: ``ses_`` and 24 random hex digits."""
    return f"ses_{uuid.uuid4().hex[:24]}"


@dataclass
class Thread:
    """One conversation of a session: its index entries (the chain value of its last prompt,
    "prompt": a retry repeats it; of its last prompt + the reply it got, "history": a
    continuation starts with it), the chain value of its first message, the instance of its
    latest call, and when it was last used (clock s)."""

    number: int
    model: str
    first: bytes | None
    indexed: dict[Kind, IndexKey] = field(default_factory=dict)
    last_instance: str | None = None
    instances: set[str] = field(default_factory=set)
    """Every instance a call of it was routed to: its end goes to each (its KV, its entry)."""
    last_used_s: float = 0.0
    inflight: int = 0
    """Its calls running now (a thread with none may be retired: book.py)."""
    prompt: tuple[bytes, ...] = ()
    """The digests of its last prompt's messages, kept for the session's latest thread only
    (drift.py compares a call with it)."""
    preference: ReservationRecord | None = None
    """The record of its route preference until released (written again then; stored as a
    reservation row); the preference itself, and the learned tool gaps, are the gateway's
    ``core.preferences.SessionPreferences``, under the thread's runtime key."""


@dataclass(frozen=True)
class Opening:
    """How a session's latest call began, as a child of it may begin too (lineage.py): the
    model, the digest of the tools it offered, the digests of its first messages (lineage.py
    says which), and the thread it ran in (whose KV on the runtime holds that prompt)."""

    model: str
    tools: bytes
    digests: tuple[bytes, ...]
    thread: int


@dataclass(frozen=True)
class Parent:
    """A child session's parent as routing and the runtime are told it (lineage.py): its key
    on the runtime (None: no parent to tell), and how many of the call's first prompt tokens
    equal the parent's prompt."""

    key: str | None = None
    prefix_tokens: int = 0


NO_PARENT = Parent()


@dataclass
class SessionState:
    """One live session as this replica holds it. ``key`` is the internal key (``ses_<hex>``,
    the ``session_key`` that the store and the runtime see); ``session_id`` is the client's id
    (its key for an implicit session). Times ending in ``_s`` are seconds of the gateway's
    clock."""

    key: str
    tenant_id: str
    session_id: str
    identity_source: str
    model: str
    started_at: datetime
    started_s: float
    """Clock time of the first call (for SCT)."""
    parent_key: str | None = None
    """The parent's key: a live session of the same tenant that the request named, or the
    session an implicit side call belongs to (resolve.py); None for a root."""
    root_key: str = ""
    """The session whose client id this family shares (itself for a root)."""
    calls: int = 0
    inflight: int = 0
    last_activity_s: float = 0.0
    last_instance: str | None = None
    last_finish_reason: str | None = None
    tools: bytes = b""
    """Digest of the tools the last call offered (conversation.tools_fingerprint)."""
    opening: Opening | None = None
    """How its latest call began (lineage.py: what a child's prompt is compared with)."""
    threads: dict[int, Thread] = field(default_factory=dict)
    """Its live conversations, by number (book.py retires the least recently used beyond
    its bound; numbers are never reused)."""
    next_thread: int = 0
    """The number its next new thread gets."""
    ended: bool = False
    route_key: str | None = None
    """Its key among proxy replicas (proxy/cluster/owner.py); None without replicas."""
    agent: str = ""
    """The agent's kind, as its first call here said (``Identity.agent``)."""
    adopted: bool = False
    """Taken over from the replica that held it before (proxy/cluster/): its next call
    continues it, whatever conversation it sends (this replica has not seen any)."""

    @property
    def is_root(self) -> bool:
        """Not a child: the family's root is this session itself."""
        return self.root_key == self.key

    def runtime_key(self, thread: int) -> str:
        """The key thread ``thread``'s KV is kept under on the runtime, and its preference
        and learned gaps in ``SessionPreferences``: the session's key for thread 0,
        ``<key>/<n>`` for thread n."""
        return self.key if thread == 0 else f"{self.key}/{thread}"

    @property
    def has_preference(self) -> bool:
        """Some thread of it holds a route preference (the session is in a tool)."""
        return any(t.preference is not None for t in self.threads.values())

    @property
    def last_thread(self) -> Thread | None:
        """The thread of its latest call, if any."""
        return max(self.threads.values(), key=lambda t: t.last_used_s, default=None)


@dataclass(frozen=True)
class Resolution:
    """The session a call belongs to, its thread, and ``how`` it was found (index.py's
    ``How``)."""

    state: SessionState
    how: How
    shared_tokens: int
    """Estimated tokens of this call's prompt that the thread's KV already holds."""
    thread: int = 0
    drift_at: int | None = None
    """For a ``drifted`` call: the first message it rewrote (drift.py)."""
    parent: Parent = NO_PARENT
    """For a child session's call: its parent, and the prefix they share (lineage.py)."""
