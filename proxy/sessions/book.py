"""The live sessions and the index that finds them: one place for a session's identity, its
conversation, its family and its end.

A session is keyed internally by ``key`` (``ses_<24 hex>``, ``session_key`` in the records,
the store and the runtime protocol); the store, the runtime and the routing only ever see that
key, so equal client ids of two tenants are two sessions whose KV and records never meet. The
client's own id is ``session_id`` (for an implicit session, its key).

``resolve`` picks the session of a call:

1. **Explicit id** (tenant, id): the live session of that id, if the call continues its
   conversation or that of one of its children; a call that continues none opens a *child*
   (parent = that session: a sub-agent, a side question); with no live session of that id, a
   new one.
2. **Implicit**: the live implicit session of the same tenant and model whose conversation the
   call continues (a session its client named is only continued under that name); else a new
   one.

"Continues" (see conversation.py for the chain values ``h_i`` of a call's messages): each live
session indexes ``h`` of its last prompt and of its last prompt + the reply it got. For ``i``
from the call's length down: a *history* match at ``i`` (and more messages follow) is a
continuation; a *prompt* match at ``i`` is a retry when nothing follows, or a continuation
whose reply the agent rewrote when the next message is the assistant's. The longest match wins
(a history match before a prompt match at the same ``i``). Cost: at most two dictionary
lookups per message of the call, whatever the number of sessions.

Bounds: at most ``capacity`` live sessions in all (the least recently used are forgotten
beyond it) and ``max_per_tenant`` per tenant, implicit, named and children alike: a call that
would open one more gets :class:`SessionLimit` (the gateway's 429); calls that continue,
retry or take over a live session are never refused. The conversation index holds two
entries per session (its last prompt, its last prompt + reply).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from talaria.proxy.records import ReservationRecord
from talaria.proxy.sessions.conversation import Conversation, Fingerprint, extend
from talaria.proxy.sessions.identity import Identity

Kind = Literal["prompt", "history"]
IndexKey = tuple[str, str, Kind, bytes]
"""(tenant, model, kind, chain value)."""
How = Literal["new", "continued", "retry", "child", "adopted"]


DEFAULT_MAX_PER_TENANT = 10_000
"""Live sessions per tenant (``TALARIA_MAX_SESSIONS_PER_TENANT``): a tenth of the book's
capacity, so one tenant cannot push the others' sessions out."""


class SessionLimit(Exception):
    """A call would open a session past its tenant's ``limit`` of live sessions."""

    def __init__(self, tenant_id: str, limit: int, oldest_activity_s: float) -> None:
        super().__init__(f"tenant {tenant_id} has {limit} live sessions")
        self.limit = limit
        self.oldest_activity_s = oldest_activity_s
        """Clock time (s) of the last call of the tenant's least recently used session: it
        may idle out first."""


def new_key() -> str:
    """A fresh internal session key: ``ses_`` and 24 random hex digits."""
    return f"ses_{uuid.uuid4().hex[:24]}"


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
    """The parent's key (a child, or a session whose client named a live parent), else the
    parent id the client gave."""
    root_key: str = ""
    """The session whose client id this family shares (itself for a root)."""
    calls: int = 0
    inflight: int = 0
    last_activity_s: float = 0.0
    last_instance: str | None = None
    last_finish_reason: str | None = None
    tools: bytes = b""
    """Digest of the tools the last call offered (conversation.tools_fingerprint)."""
    indexed: dict[Kind, IndexKey] = field(default_factory=dict)
    """The index entries of the session: the chain value of its last prompt ("prompt": a retry
    repeats it) and of its last prompt + the reply it got ("history": a continuation starts
    with it)."""
    reservation: ReservationRecord | None = None
    """The record of its soft reservation until released (written again then); the
    reservation itself, and the learned tool gaps, are the gateway's
    ``core.reservations.SessionReservations``."""
    ended: bool = False
    route_key: str | None = None
    """Its key among proxy replicas (proxy/cluster/owner.py); None without replicas."""
    adopted: bool = False
    """Taken over from the replica that held it before (proxy/cluster/): its next call
    continues it, whatever conversation it sends (this replica has not seen any)."""

    @property
    def is_root(self) -> bool:
        """Not a child: the family's root is this session itself."""
        return self.root_key == self.key


@dataclass(frozen=True)
class Resolution:
    """The session a call belongs to, and ``how`` it was found (new, continued, a retry, a
    child, or adopted from another replica)."""

    state: SessionState
    how: How
    shared_tokens: int
    """Estimated tokens of this call's prompt that the session's KV already holds."""


class SessionBook:
    """Live sessions by key, the roots by (tenant, client id), the children of each root, and
    the conversation index. Least recently used sessions are forgotten beyond ``capacity``
    (their records stay in the store). ``on_forget(key)`` runs for every session forgotten
    (ended, handed off, or evicted), so that state kept elsewhere by key goes with it."""

    def __init__(
        self,
        capacity: int = 100_000,
        on_forget: Callable[[str], object] | None = None,
        max_per_tenant: int = DEFAULT_MAX_PER_TENANT,
    ) -> None:
        self._capacity = capacity
        self._on_forget = on_forget
        self._max_per_tenant = max_per_tenant
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        """Each tenant's live session keys, least recently used first."""
        self._roots: dict[tuple[str, str], str] = {}
        self._children: dict[str, set[str]] = {}
        self._index: dict[IndexKey, list[str]] = {}

    # -- lookups --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sessions)

    def count(self, tenant_id: str) -> int:
        """The tenant's live sessions."""
        return len(self._by_tenant.get(tenant_id, ()))

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._sessions.values()))

    def get(self, key: str) -> SessionState | None:
        """The live session with internal key ``key`` (not a client's id: see :meth:`named`)."""
        return self._sessions.get(key)

    def named(self, tenant_id: str, session_id: str) -> SessionState | None:
        """The live session the tenant calls ``session_id`` (a root), else one whose key it
        is (an implicit session or a child, named by the key the proxy sent back)."""
        key = self._roots.get((tenant_id, session_id), session_id)
        state = self._sessions.get(key)
        return state if state is not None and state.tenant_id == tenant_id else None

    def by_session_id(self, session_id: str) -> list[SessionState]:
        """Live root sessions of any tenant that the client calls ``session_id`` (a scan: for
        the admin API, not the call path)."""
        return [s for s in self._sessions.values() if s.session_id == session_id and s.is_root]

    def children(self, key: str) -> list[SessionState]:
        """The live children of the root session with internal key ``key``, sorted by key."""
        return [
            self._sessions[k] for k in sorted(self._children.get(key, ())) if k in self._sessions
        ]

    # -- resolving a call -----------------------------------------------------------------
    def resolve(
        self,
        *,
        tenant_id: str,
        identity: Identity,
        model: str,
        conversation: Conversation,
        now_s: float,
        now_at: datetime,
        match: bool = True,
    ) -> Resolution:
        """The session of this call (created if need be); ``match=False`` skips conversation
        matching (a prompt that is not a conversation, e.g. a text completion)."""
        root: SessionState | None = None
        if identity.session_id is not None:
            root = self.named(tenant_id, identity.session_id)
            if root is not None and root.root_key != root.key:
                root = None  # the client named a child by its key: treat as a new root
        if root is not None and root.adopted:  # its first call here continues it
            root.adopted = False
            self._touch(root, now_s)
            return Resolution(root, "adopted", 0)
        if not match and root is not None:  # nothing to match: the named session it is
            self._touch(root, now_s)
            return Resolution(root, "continued", 0)
        if match and (root is not None or identity.session_id is None):
            family = None if root is None else {root.key, *self._children.get(root.key, ())}
            found = self._match(tenant_id, model, conversation, family)
            if found is not None:
                self._touch(found.state, now_s)
                return found
        parent_key = None
        if root is not None:
            parent_key = root.key
        elif identity.parent_session_id is not None:  # the parent's key, else its id as given
            parent = self.named(tenant_id, identity.parent_session_id)
            parent_key = parent.key if parent is not None else identity.parent_session_id
        owned = self._by_tenant.get(tenant_id)
        if owned is not None and len(owned) >= self._max_per_tenant:
            oldest = self._sessions[next(iter(owned))]
            raise SessionLimit(tenant_id, self._max_per_tenant, oldest.last_activity_s)
        key = new_key()
        explicit = identity.session_id is not None
        state = SessionState(
            key=key,
            tenant_id=tenant_id,
            session_id=identity.session_id if explicit else key,  # type: ignore[arg-type]
            identity_source=identity.source,
            model=model,
            started_at=now_at,
            started_s=now_s,
            parent_key=parent_key,
            root_key=root.key if root is not None else key,
            last_activity_s=now_s,
        )
        self._hold(state)
        if root is not None:
            self._children.setdefault(root.key, set()).add(key)
        elif explicit:
            self._roots[(tenant_id, state.session_id)] = key
        self._evict()
        return Resolution(state, "child" if root is not None else "new", 0)

    def _match(
        self,
        tenant_id: str,
        model: str,
        conversation: Conversation,
        family: set[str] | None,
    ) -> Resolution | None:
        values, prints = conversation.hashes, conversation.prints
        n = len(prints)
        for i in range(n, 0, -1):
            kinds: list[Kind] = ["history", "prompt"] if i < n else ["prompt"]
            for kind in kinds:
                if kind == "prompt" and i < n and prints[i].role != "assistant":
                    continue
                for key in self._index.get((tenant_id, model, kind, values[i - 1]), ()):
                    if family is not None and key not in family:
                        continue
                    state = self._sessions.get(key)
                    if state is None or state.ended:
                        continue
                    if family is None and state.identity_source != "implicit":
                        continue  # a named session is only ever continued under its name
                    how: How = "retry" if i == n else "continued"
                    return Resolution(state, how, conversation.tokens[i])
        return None

    # -- a session's conversation ---------------------------------------------------------
    def call_started(self, state: SessionState, prompt: Conversation, now_s: float) -> None:
        """A call with this prompt was sent: index it (a retry or a parallel call finds it)."""
        state.calls += 1
        state.inflight += 1
        self._touch(state, now_s)
        if prompt.last is not None:
            self._reindex(state, "prompt", prompt.last)

    def call_finished(
        self, state: SessionState, prompt: Conversation, reply: Fingerprint, now_s: float
    ) -> None:
        """The call got ``reply``: prompt + reply is the conversation to continue."""
        state.last_activity_s = now_s
        self._reindex(state, "history", extend(prompt.last or b"", reply))

    def _reindex(self, state: SessionState, kind: Kind, value: bytes) -> None:
        self._unindex(state, kind)
        key: IndexKey = (state.tenant_id, state.model, kind, value)
        self._index.setdefault(key, []).append(state.key)
        state.indexed[kind] = key

    def _unindex(self, state: SessionState, kind: Kind) -> None:
        old = state.indexed.pop(kind, None)
        if old is None:
            return
        keys = self._index.get(old)
        if keys is not None:
            if state.key in keys:
                keys.remove(state.key)
            if not keys:
                del self._index[old]

    def _touch(self, state: SessionState, now_s: float) -> None:
        state.last_activity_s = now_s
        self._sessions.move_to_end(state.key)
        self._by_tenant[state.tenant_id].move_to_end(state.key)

    def _hold(self, state: SessionState) -> None:
        self._sessions[state.key] = state
        self._by_tenant.setdefault(state.tenant_id, OrderedDict())[state.key] = None

    def adopt(self, state: SessionState) -> None:
        """Hold ``state``, a root session another replica held before (it keeps its key; past
        the tenant's cap too: it continues a session)."""
        self._hold(state)
        self._roots[(state.tenant_id, state.session_id)] = state.key
        self._evict()

    # -- ends -----------------------------------------------------------------------------
    def forget(self, state: SessionState) -> None:
        """Mark the session ended and remove it from every map (it ended, was handed off, or
        is evicted), then run ``on_forget(key)``."""
        state.ended = True
        if self._sessions.pop(state.key, None) is not None:
            owned = self._by_tenant[state.tenant_id]
            del owned[state.key]
            if not owned:
                del self._by_tenant[state.tenant_id]
        for kind in ("prompt", "history"):
            self._unindex(state, kind)
        if self._roots.get((state.tenant_id, state.session_id)) == state.key:
            del self._roots[(state.tenant_id, state.session_id)]
        self._children.pop(state.key, None)
        if state.root_key != state.key:
            siblings = self._children.get(state.root_key)
            if siblings is not None:
                siblings.discard(state.key)
        if self._on_forget is not None:
            self._on_forget(state.key)

    def idle(self, now_s: float, timeout_s: float) -> list[SessionState]:
        """Sessions with no call in flight and none for ``timeout_s``."""
        return [
            s
            for s in self._sessions.values()
            if s.inflight == 0 and now_s - s.last_activity_s > timeout_s
        ]

    def _evict(self) -> None:
        while len(self._sessions) > self._capacity:
            _, oldest = next(iter(self._sessions.items()))
            self.forget(oldest)
