"""A session's life on one node, from its first call here to the node forgetting it:
``SessionLifecycle``, the one writer of the node's sessions (``NodeSessions``, sessions.py).

It takes a call's arrival (the session's hold released: it returned) and its end (counted; a
final call ends the session, any other lets the hold policy hold for the next call,
policies/holding.py), the session control a proxy sends (a tool-gap hint, a move, an
end), and forgets a session — its entry, what every listener of the node's events keeps of it,
its KV unless a call holds it — when it ended and its last call here settled, when its model
left the node, or when it idled past ``forget_idle_s`` with no hold. Holds change only through
the slot loop (``SlotLoop.hold`` / ``release_hold``).
"""

from __future__ import annotations

from talaria.core.holds import ReleaseReason
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.fairness import ServiceAccounts
from talaria.runtime.scheduling.loop import SlotLoop
from talaria.runtime.scheduling.policies.compose import NodePolicies
from talaria.runtime.scheduling.sessions import NodeSession, NodeSessions
from talaria.runtime.scheduling.state import NodeContext


class SessionLifecycle:
    """The node's sessions between and after their calls (the module docstring): it alone
    changes ``NodeSessions``; the slot loop and the status reader read them through
    ``SessionsView``."""

    def __init__(
        self,
        context: NodeContext,
        sessions: NodeSessions,
        loop: SlotLoop,
        policies: NodePolicies,
        accounts: ServiceAccounts,
        events: SessionEvents,
    ) -> None:
        self._config = context.config
        self._memory = context.memory
        self._signals = context.signals
        self._sessions = sessions
        self._loop = loop
        self._policies = policies
        self._accounts = accounts
        self._events = events

    # -- a call's arrival and end ----------------------------------------------------------
    def arrived(self, request: CallRequest, now_s: float) -> None:
        """A call of the session came: forget the sessions idle past their time
        (``forget_idle``), count the call, and release the session's hold (it returned)."""
        self.forget_idle(now_s)
        self._sessions.arrived(request, now_s)
        self._loop.release_hold(request.session_key, ReleaseReason.RETURNED)

    def session_of(self, request: CallRequest) -> NodeSession:
        """The session of a call the intake decides on; a call queued before its session
        ended (e.g. by a final call) gets a fresh record."""
        return self._sessions.get_or_add(request.session_key, request.model)

    def finished(self, request: CallRequest, result: CallResult) -> None:
        """A call finished: count it for its session, end the session on a final call, else
        take the call's gap hint and let the hold policy hold for its next call
        (policies/holding.py)."""
        session = self._sessions.finished(result)
        if session is None:
            return
        if request.session_final:
            self.end(request.session_key)
            return
        if request.expected_tool_gap_s is not None:
            session.hint_gap_s = min(request.expected_tool_gap_s, self._config.max_hint_gap_s)
        self._policies.holds.after_call(
            session,
            self._sessions,
            lambda gap_s, hold_s: self._loop.hold(result, session, gap_s, hold_s),
        )

    def settled(self, session_key: str) -> None:
        """A call of the session left the node; the last of a session that ended goes."""
        if self._sessions.settled(session_key) is not None:
            self.forget(session_key)

    # -- session control -------------------------------------------------------------------
    def hint(self, session_key: str, expected_gap_s: float) -> None:
        """A tool started: the session expects to be back in ``expected_gap_s`` (at most
        ``max_hint_gap_s``)."""
        session = self._sessions.get(session_key)
        if session is not None and not session.ended:
            session.hint_gap_s = min(expected_gap_s, self._config.max_hint_gap_s)

    def moved(self, session_key: str) -> None:
        """The session's next call went elsewhere: release its hold here (its KV stays,
        evictable, in case it comes back)."""
        self._loop.release_hold(session_key, ReleaseReason.MOVED)
        self._signals.poke()

    def end(self, session_key: str) -> None:
        """The session ended: release its hold and forget it (``forget``), at once,
        or when its last call here settles if some are queued or running."""
        self._loop.release_hold(session_key, ReleaseReason.ENDED)
        session = self._sessions.get(session_key)
        if session is not None and session.pending:
            session.ended = True
        else:
            self.forget(session_key)
        self._signals.poke()

    # -- forgetting ------------------------------------------------------------------------
    def forget(self, session_key: str) -> None:
        """Drop everything the node keeps of the session: its entry (gaps, hints, counts),
        what every listener of the node's events keeps of it (its fair-queue account), and its
        KV unless a call still holds it."""
        self._sessions.forget(session_key)
        self._events.session_ended(session_key)
        entry = self._memory.kv.get(session_key)
        if entry is not None and not entry.pinned:
            self._memory.drop(session_key)

    def forget_model(self, model: str) -> None:
        """The node stops hosting ``model``: release each of its sessions' holds (they moved)
        and forget them."""
        for key in [k for k, s in self._sessions.sessions.items() if s.model == model]:
            self._loop.release_hold(key, ReleaseReason.MOVED)
            self.forget(key)

    def forget_idle(self, now_s: float) -> None:
        """Forget the sessions idle for ``forget_idle_s`` that have no hold (the
        backstop for ends that never came: SchedulerConfig); one that holds one counts as
        seen now."""
        live = self._loop.holds.live
        for key in self._sessions.expired(now_s, self._config.forget_idle_s):
            if key in live:
                self._sessions.touch(key, now_s)
            else:
                self.forget(key)

    def keys(self) -> set[str]:
        """Every session key the node keeps something of: a session entry, KV, a hold
        or a fair-queue account (a walk of them all: for tests and diagnostics, not the call
        path)."""
        kept = set(self._sessions.sessions) | set(self._memory.kv)
        return kept | set(self._loop.holds.live) | set(self._accounts.attained)
