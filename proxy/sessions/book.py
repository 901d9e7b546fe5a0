"""The live sessions: one place for a session's identity, its threads, its family, its end
(which session a call belongs to is resolve.py's rules, over this book).

A session is keyed internally by ``key`` (``ses_<24 hex>``, ``session_key`` in the records,
the store and the runtime protocol); the store, the runtime and the routing only ever see that
key, so equal client ids of two tenants are two sessions whose KV and records never meet. The
client's own id is ``session_id`` (for an implicit session, its key).

A session holds one or more *threads*: each distinct conversation of the session, with its own
chain values in the conversation index (index.py), its own last instance, its own route
preference and its own key on the runtime (``runtime_key``: the session's key for thread 0,
``<key>/<n>`` for thread n, so that each conversation keeps its own KV and its own
preference). Calls, tokens and the session's completion time are the session's, whatever
thread they ran in.

Bounds (tenancy.py has the rules): ``capacity`` live sessions in all, ``max_threads`` a session,
``max_per_tenant`` threads a tenant.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from talaria.proxy.sessions.conversation import Conversation, Fingerprint, extend
from talaria.proxy.sessions.index import ConversationIndex, Entry, IndexKey, Kind
from talaria.proxy.sessions.state import Resolution, SessionState, Thread
from talaria.proxy.sessions.tenancy import (
    DEFAULT_MAX_PER_TENANT,
    DEFAULT_MAX_THREADS,
    SessionLimit,
    TenantLedger,
    ThreadLimit,
)


class SessionBook:
    """Live sessions by key, the named ones by (tenant, client id), each root's family, and
    the conversation index. Least recently used sessions are forgotten beyond ``capacity``
    (their records stay in the store). ``on_forget(key)`` runs for each thread's runtime key of
    every session forgotten (ended, handed off, or evicted), so that state kept elsewhere by
    those keys goes with it; ``on_retire(state, thread)`` for each thread retired while its
    session lives on (module docstring)."""

    def __init__(
        self,
        capacity: int = 100_000,
        on_forget: Callable[[str], object] | None = None,
        max_per_tenant: int = DEFAULT_MAX_PER_TENANT,
        max_threads: int = DEFAULT_MAX_THREADS,
        on_retire: Callable[[SessionState, Thread], object] | None = None,
    ) -> None:
        self._capacity = capacity
        self._on_forget = on_forget
        self._on_retire = on_retire
        self._max_threads = max_threads
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self._tenants = TenantLedger(max_per_tenant)
        """Each tenant's live sessions, threads and waiting implicit roots."""
        self._named: dict[tuple[str, str], str] = {}
        """(tenant, client id) → key, for every session its client named (roots, children)."""
        self._children: dict[str, set[str]] = {}
        """Root key → the keys of its family's other sessions."""
        self._index = ConversationIndex()

    # -- lookups --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._sessions)

    def count(self, tenant_id: str) -> int:
        """The tenant's live sessions."""
        return self._tenants.sessions(tenant_id)

    def threads(self, tenant_id: str) -> int:
        """The tenant's live threads (every session has one at least)."""
        return self._tenants.threads(tenant_id)

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._sessions.values()))

    def get(self, key: str) -> SessionState | None:
        """The live session with internal key ``key`` (not a client's id: see :meth:`named`)."""
        return self._sessions.get(key)

    def named(self, tenant_id: str, session_id: str) -> SessionState | None:
        """The live session the tenant calls ``session_id``, else one whose key it is (an
        implicit session, named by the key the proxy sent back)."""
        key = self._named.get((tenant_id, session_id), session_id)
        state = self._sessions.get(key)
        return state if state is not None and state.tenant_id == tenant_id else None

    def by_session_id(self, session_id: str) -> list[SessionState]:
        """Live root sessions of any tenant that the client calls ``session_id`` (a scan: for
        the admin API, not the call path)."""
        return [s for s in self._sessions.values() if s.session_id == session_id and s.is_root]

    def children(self, key: str) -> list[SessionState]:
        """The live sessions of the family whose root has key ``key``, sorted by key."""
        return [
            self._sessions[k] for k in sorted(self._children.get(key, ())) if k in self._sessions
        ]

    def find(
        self,
        tenant_id: str,
        model: str,
        conversation: Conversation,
        accept: Callable[[SessionState], bool],
    ) -> Resolution | None:
        """The live session's thread that ``conversation`` continues (index.py's rules), among
        the sessions ``accept`` takes, or None."""

        def live(entry: Entry) -> bool:
            state = self._sessions.get(entry[0])
            return state is not None and accept(state)

        found = self._index.find(tenant_id, model, conversation, live)
        if found is None:
            return None
        return Resolution(self._sessions[found.key], found.how, found.shared_tokens, found.thread)

    def sole_waiting(self, tenant_id: str) -> SessionState | None:
        """The tenant's implicit root session that waits on a reply (a call in flight), when
        exactly one does."""
        waiting = self._tenants.waiting(tenant_id)
        return self._sessions[waiting[0]] if len(waiting) == 1 else None

    # -- opening sessions and threads -----------------------------------------------------
    def open_session(self, state: SessionState, named: bool) -> None:
        """Hold ``state``, a new session (resolve.py makes it; no thread yet:
        :meth:`open_thread`), if the tenant has room (else :class:`SessionLimit`): in its
        root's family if it is a child, under its client's id if ``named``."""
        self._require_room(state.tenant_id)
        self._hold(state)
        if state.parent_key is not None:
            self._children.setdefault(state.root_key, set()).add(state.key)
        if named:
            self._named[(state.tenant_id, state.session_id)] = state.key
        self._evict()

    def has_room(self, tenant_id: str) -> bool:
        """Whether the tenant may open one more session (below its cap of live threads)."""
        return not self._tenants.full(tenant_id)

    def adopt(self, state: SessionState) -> None:
        """Hold ``state``, a root session another replica held before, or one this replica
        claimed in the store (it keeps its key; past the tenant's cap too: it continues a
        session, and a claim is made only with room: :meth:`has_room`)."""
        self._hold(state)
        self._named[(state.tenant_id, state.session_id)] = state.key
        self._evict()

    def touch(self, state: SessionState, now_s: float) -> None:
        """``state`` was used at ``now_s``: the most recently used (unless forgotten)."""
        if state.key not in self._sessions:  # forgotten while its call ran
            return
        state.last_activity_s = now_s
        self._sessions.move_to_end(state.key)
        self._tenants.touch(state.tenant_id, state.key)

    def _hold(self, state: SessionState) -> None:
        self._sessions[state.key] = state
        self._tenants.hold(state.tenant_id, state.key)

    def open_thread(
        self, state: SessionState, model: str, conversation: Conversation | None
    ) -> int:
        """A new thread of ``state``, its number: the session's first, or one more (tenancy.py:
        past ``max_threads`` the least recently used idle one is retired; none idle,
        :class:`ThreadLimit`; the tenant at its cap, :class:`SessionLimit`)."""
        if len(state.threads) >= self._max_threads:
            idle = [t for t in state.threads.values() if t.inflight == 0]
            if not idle:
                raise ThreadLimit(state.key, self._max_threads)
            self._retire(state, min(idle, key=lambda t: t.last_used_s))
        elif state.threads:
            self._require_room(state.tenant_id)
        first = conversation.hashes[0] if conversation is not None and len(conversation) else None
        thread = Thread(state.next_thread, model, first, last_used_s=state.last_activity_s)
        if not state.threads:  # a session taken over keeps the instance its KV is on
            thread.last_instance = state.last_instance
        self._add_thread(state, thread)
        return thread.number

    def _add_thread(self, state: SessionState, thread: Thread) -> None:
        state.threads[thread.number] = thread
        state.next_thread = max(state.next_thread, thread.number + 1)
        self._tenants.thread_opened(state.tenant_id)

    def _retire(self, state: SessionState, thread: Thread) -> None:
        """Drop ``thread`` (no call in flight) from the session and the index; then
        ``on_retire``."""
        self._unindex_thread(state, thread)
        del state.threads[thread.number]
        self._tenants.threads_closed(state.tenant_id)
        if self._on_retire is not None:
            self._on_retire(state, thread)

    def _require_room(self, tenant_id: str) -> None:
        """:class:`SessionLimit` when the tenant holds its cap of live threads."""
        if self._tenants.full(tenant_id):
            oldest = self._tenants.oldest(tenant_id)
            activity = self._sessions[oldest].last_activity_s if oldest is not None else 0.0
            raise SessionLimit(tenant_id, self._tenants.max_threads, activity)

    # -- a thread's conversation ----------------------------------------------------------
    def call_started(
        self, state: SessionState, prompt: Conversation, now_s: float, thread: int = 0
    ) -> None:
        """A call of ``thread`` with this prompt was sent: index it (a retry or a parallel
        call finds it)."""
        state.calls += 1
        state.inflight += 1
        self.touch(state, now_s)
        conversation = self._thread(state, thread)
        conversation.inflight += 1
        conversation.last_used_s = now_s
        if state.inflight == 1 and state.is_root and state.identity_source == "implicit":
            self._tenants.waits(state.tenant_id, state.key, True)
        for other in state.threads.values():
            other.prompt = ()
        conversation.prompt = tuple(p.digest for p in prompt.prints)
        if prompt.last is not None:
            self._reindex(state, conversation, "prompt", prompt.last)

    def call_finished(
        self,
        state: SessionState,
        prompt: Conversation,
        reply: Fingerprint,
        now_s: float,
        thread: int = 0,
    ) -> None:
        """The call of ``thread`` got ``reply``: prompt + reply is the conversation to
        continue."""
        self.touch(state, now_s)
        conversation = state.threads.get(thread)
        if conversation is not None and not state.ended:
            self._reindex(state, conversation, "history", extend(prompt.last or b"", reply))

    def call_ended(self, state: SessionState, thread: int) -> None:
        """A call of ``thread`` is over (replied, failed or cancelled): one fewer in flight."""
        state.inflight -= 1
        held = state.threads.get(thread)
        if held is not None:
            held.inflight -= 1
        if state.inflight == 0:
            self._tenants.waits(state.tenant_id, state.key, False)

    def _thread(self, state: SessionState, number: int) -> Thread:
        held = state.threads.get(number)
        if held is None:  # a thread the book did not open (adoption)
            held = Thread(number, state.model, None)
            self._add_thread(state, held)
        return held

    def _reindex(self, state: SessionState, thread: Thread, kind: Kind, value: bytes) -> None:
        old = thread.indexed.pop(kind, None)
        if old is not None:
            self._index.drop(old, (state.key, thread.number))
        key: IndexKey = (state.tenant_id, thread.model, kind, value)
        self._index.put(key, (state.key, thread.number))
        thread.indexed[kind] = key

    def _unindex_thread(self, state: SessionState, thread: Thread) -> None:
        for key in thread.indexed.values():
            self._index.drop(key, (state.key, thread.number))
        thread.indexed.clear()

    # -- ends -----------------------------------------------------------------------------
    def forget(self, state: SessionState) -> None:
        """Mark the session ended and remove it from every map (it ended, was handed off, or
        is evicted), then run ``on_forget(key)``."""
        state.ended = True
        if self._sessions.pop(state.key, None) is not None:
            self._tenants.release(state.tenant_id, state.key, len(state.threads))
        for thread in state.threads.values():
            self._unindex_thread(state, thread)
        if self._named.get((state.tenant_id, state.session_id)) == state.key:
            del self._named[(state.tenant_id, state.session_id)]
        self._children.pop(state.key, None)
        if state.root_key != state.key:
            family = self._children.get(state.root_key)
            if family is not None:
                family.discard(state.key)
        if self._on_forget is not None:
            for number in state.threads or (0,):
                self._on_forget(state.runtime_key(number))

    def idle(self, now_s: float, timeout_s: float) -> list[SessionState]:
        """Sessions with no call in flight and none for ``timeout_s``: the book is in order of
        last activity (``touch``), so the walk stops at the first recent one (issue 46)."""
        found: list[SessionState] = []
        for state in self._sessions.values():
            if now_s - state.last_activity_s <= timeout_s:
                break
            if state.inflight == 0:
                found.append(state)
        return found

    def _evict(self) -> None:
        while len(self._sessions) > self._capacity:
            _, oldest = next(iter(self._sessions.items()))
            self.forget(oldest)
