"""The bounds on what a tenant and a session hold live, and what each tenant holds live in the
session book, kept as the book changes so that no call scans a tenant's sessions:

- its live session keys, least recently used first (the oldest may idle out first: the
  ``Retry-After`` of a refusal);
- its live *threads* (a session's conversations, state.py ``Thread``; every session has at
  least one): the tenant's cap counts these, so a session that opens thread after thread
  uses its tenant's room as separate sessions would;
- its implicit root sessions waiting on a reply (a call in flight): a new implicit call is
  such a session's side call only when exactly one waits (resolve.py ``_side_call_of``).

Bounds: at most ``capacity`` live sessions in all (the least recently used are forgotten
beyond it). A session holds at most ``max_threads`` live threads: opening one more *retires*
its least recently used thread with no call in flight (out of the index, its route
preference released and its runtime entry ended by ``on_retire``), and when every thread has
a call in flight the call gets ``ThreadLimit`` (the gateway's 429). A tenant holds at most
``max_per_tenant`` live threads, every session's counted (implicit, named and children alike;
each session has one at least: tenancy.py): a call that would open one more gets
``SessionLimit`` (429); calls that continue, retry or take over a live session's thread
are never refused. The conversation index holds two entries per live thread (its last
prompt, its last prompt + reply). What each tenant holds is kept as it changes (tenancy.py),
so no call scans a tenant's sessions.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_MAX_THREADS = 64
"""Live threads a session may hold (``TALARIA_MAX_THREADS_PER_SESSION``). An agent's session
has one conversation, plus a few side ones (titles, summaries, sub-tasks under the same id,
compactions); 64 leaves room for all of them, and the least recently used idle one is
retired beyond it (a call of it later opens a new thread)."""


DEFAULT_MAX_PER_TENANT = 10_000
"""Live threads per tenant, sessions' included (``TALARIA_MAX_SESSIONS_PER_TENANT``): a tenth
of the book's capacity, so one tenant cannot push the others' sessions out."""


class SessionLimit(Exception):
    """A call would open a session or thread past its tenant's ``limit`` of live threads."""

    def __init__(self, tenant_id: str, limit: int, oldest_activity_s: float) -> None:
        super().__init__(f"tenant {tenant_id} has {limit} live sessions and threads")
        self.limit = limit
        self.oldest_activity_s = oldest_activity_s
        """Clock time (s) of the last call of the tenant's least recently used session: it
        may idle out first."""


class ThreadLimit(Exception):
    """A call would open a thread of a session whose ``limit`` live threads all have a call
    in flight (none can be retired)."""

    def __init__(self, session_key: str, limit: int) -> None:
        super().__init__(f"session {session_key} has {limit} threads with calls in flight")
        self.limit = limit


class TenantLedger:
    """Each tenant's live sessions (LRU), live threads and waiting implicit roots (module
    docstring); ``max_threads``: the live threads a tenant may hold."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self._sessions: dict[str, OrderedDict[str, None]] = {}
        self._threads: dict[str, int] = {}
        self._waiting: dict[str, dict[str, None]] = {}

    def sessions(self, tenant_id: str) -> int:
        """The tenant's live sessions."""
        return len(self._sessions.get(tenant_id, ()))

    def threads(self, tenant_id: str) -> int:
        """The tenant's live threads (at least one per session)."""
        return self._threads.get(tenant_id, 0)

    def full(self, tenant_id: str) -> bool:
        """Whether the tenant holds ``max_threads`` live threads (it may open no more)."""
        return self.threads(tenant_id) >= self.max_threads

    def oldest(self, tenant_id: str) -> str | None:
        """The tenant's least recently used live session, if any."""
        owned = self._sessions.get(tenant_id)
        return next(iter(owned)) if owned else None

    def hold(self, tenant_id: str, key: str) -> None:
        """A session of the tenant is live (most recently used)."""
        self._sessions.setdefault(tenant_id, OrderedDict())[key] = None

    def touch(self, tenant_id: str, key: str) -> None:
        """The session was used now."""
        self._sessions[tenant_id].move_to_end(key)

    def release(self, tenant_id: str, key: str, threads: int) -> None:
        """The session and its ``threads`` live threads are gone."""
        owned = self._sessions.get(tenant_id)
        if owned is not None and key in owned:
            del owned[key]
            if not owned:
                del self._sessions[tenant_id]
        self.threads_closed(tenant_id, threads)
        self.waits(tenant_id, key, False)

    def thread_opened(self, tenant_id: str) -> None:
        """One more live thread."""
        self._threads[tenant_id] = self.threads(tenant_id) + 1

    def threads_closed(self, tenant_id: str, count: int = 1) -> None:
        """``count`` live threads are gone."""
        left = self.threads(tenant_id) - count
        if left > 0:
            self._threads[tenant_id] = left
        else:
            self._threads.pop(tenant_id, None)

    def waits(self, tenant_id: str, key: str, waiting: bool) -> None:
        """Whether the tenant's implicit root session ``key`` waits on a reply now."""
        if waiting:
            self._waiting.setdefault(tenant_id, {})[key] = None
            return
        held = self._waiting.get(tenant_id)
        if held is not None and key in held:
            del held[key]
            if not held:
                del self._waiting[tenant_id]

    def waiting(self, tenant_id: str) -> list[str]:
        """The tenant's implicit root sessions that wait on a reply, as many as there are
        up to two (enough to tell one from several)."""
        held = self._waiting.get(tenant_id, {})
        return [key for key, _ in zip(held, range(2), strict=False)]
