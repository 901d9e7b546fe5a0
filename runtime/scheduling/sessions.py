"""The node's view of the sessions it serves (``NodeSessions``, one ``NodeSession`` each): their
calls here, their KV use (context and growth) and their expected tool gaps; the inputs of SP
admission (is a call a continuation, how long will it decode), of soft reservations (the
expected gap and KV growth) and of demand (who is in a tool gap and due back).

``node.NodeScheduler`` owns it and alone changes it; the slot loop and the status reader read
it through ``SessionsView``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from talaria.core.gaps import GapPrediction, PopulationGaps, SessionGaps, predict_session
from talaria.core.reservations import GapEstimator
from talaria.core.types import DEFAULT_TENANT, CallRequest, CallResult


@dataclass
class NodeSession:
    """One session's history on this node."""

    model: str
    calls: int = 0
    """Calls of the session finished here (> 0: its next call is a continuation)."""
    last_finish_s: float | None = None
    gaps: GapEstimator = field(default_factory=GapEstimator)
    log_gaps: SessionGaps = field(default_factory=SessionGaps)
    """Its own ln(gap)s, for ``learned_gaps`` (core/gaps.py)."""
    output_tokens: int = 0
    appended_tokens: int = 0
    """Prompt tokens the calls after the first added to the previous call's context."""
    context_tokens: int = 0
    """The last finished call's prompt + output tokens."""
    hint_gap_s: float | None = None
    pending: int = 0
    """Calls of the session queued or running here."""
    rank: int = 1
    """The class of its latest call (``Priority.rank``: 0 interactive, 1 standard, 2 batch)."""
    tenant: str = DEFAULT_TENANT
    tenant_weight: float = 1.0
    """Its tenant (``CallRequest.tenant``) and the tenant's weight, as its latest call said."""
    agent: str = ""
    """The kind of agent it is (``CallRequest.agent``), as its latest call said."""

    @property
    def population(self) -> tuple[str, str, str]:
        """The key its tool gaps are learned under: (tenant, model, agent)."""
        return (self.tenant, self.model, self.agent)

    def expected_gap_s(self) -> float:
        """The caller's hint if it gave one, else the mean observed gap (with its prior)."""
        return self.hint_gap_s if self.hint_gap_s is not None else self.gaps.expected_s()

    def expected_output_tokens(self, default: int) -> int:
        """round(output_tokens / calls): the mean output so far; ``default`` before any call."""
        return round(self.output_tokens / self.calls) if self.calls else default

    def expected_growth_tokens(self, default_output: int) -> int:
        """Tokens the next call is expected to add: mean appended + mean output so far."""
        appended = self.appended_tokens / (self.calls - 1) if self.calls > 1 else 0
        return round(appended) + self.expected_output_tokens(default_output)


class SessionsView(Protocol):
    """What the node's readers of its sessions may ask (``NodeSessions`` implements it)."""

    def __contains__(self, session_key: str) -> bool: ...

    def get(self, session_key: str) -> NodeSession | None:
        """The session, if it has called here."""
        ...

    def in_gap(self, now_s: float, stale_window_s: float) -> list[NodeSession]:
        """Sessions in a tool gap (``NodeSessions.in_gap``)."""
        ...

    def classes_seen(self) -> int:
        """How many classes have sent calls here (``NodeSessions.classes_seen``)."""
        ...

    def live_counts(self, now_s: float, stale_window_s: float) -> dict[str, int]:
        """Per model: live sessions (``NodeSessions.live_counts``)."""
        ...

    def tenant_weights(self, now_s: float, stale_window_s: float) -> dict[str, float]:
        """Per tenant with a live session: its weight (``NodeSessions.tenant_weights``)."""
        ...


class NodeSessions:
    """The sessions of one node by key (``CallRequest.session_key``), in first-seen order."""

    def __init__(self, population: PopulationGaps | None = None) -> None:
        self.sessions: dict[str, NodeSession] = {}
        self.ranks: dict[int, int] = {}
        """Calls that arrived here per class."""
        self.population = population
        """``learned_gaps``: the node's log-normal gap fits by (tenant, model, agent); None:
        off."""

    def __contains__(self, session_key: str) -> bool:
        return session_key in self.sessions

    def get(self, session_key: str) -> NodeSession | None:
        """The session, or None if this node does not know it."""
        return self.sessions.get(session_key)

    def get_or_add(self, session_key: str, model: str) -> NodeSession:
        """The session, created on its first call (or on a call queued before it ended)."""
        return self.sessions.setdefault(session_key, NodeSession(model))

    def forget(self, session_key: str) -> None:
        """The session ended: drop what the node knew of it."""
        self.sessions.pop(session_key, None)

    def arrived(self, request: CallRequest, now_s: float) -> None:
        """A call of the session arrived: observe the gap since its last call ended and the
        tokens its prompt appended to that call's context, and count it pending."""
        session = self.get_or_add(request.session_key, request.model)
        if session.last_finish_s is not None:
            gap = now_s - session.last_finish_s
            session.gaps.observe(gap)
            if self.population is not None:
                session.log_gaps.observe(gap)
                self.population.observe((request.tenant, request.model, request.agent), gap)
        if session.context_tokens:
            session.appended_tokens += max(0, request.prompt_tokens - session.context_tokens)
        session.pending += 1
        session.rank = request.priority.rank
        session.tenant, session.tenant_weight = request.tenant, request.tenant_weight
        session.agent = request.agent
        self.ranks[session.rank] = self.ranks.get(session.rank, 0) + 1

    def predicted_gap(self, session: NodeSession, quantile: float) -> GapPrediction:
        """``learned_gaps``: the session's learned median gap and hold to ``quantile``
        (core/gaps.py), from its own gaps and its (tenant, model, agent) population's fit (the
        prior when off)."""
        population = self.population or PopulationGaps()
        fit = population.fit(session.population)
        return predict_session(session.log_gaps, fit, quantile=quantile)

    def settled(self, session_key: str) -> None:
        """A call of the session left the node (finished, failed or withdrawn)."""
        session = self.sessions.get(session_key)
        if session is not None and session.pending > 0:
            session.pending -= 1

    def finished(self, result: CallResult) -> NodeSession | None:
        """Count a finished call (its output and context); None if the session is gone."""
        session = self.sessions.get(result.session_key)
        if session is None:
            return None
        session.calls += 1
        session.output_tokens += result.output_tokens
        session.context_tokens = result.prompt_tokens + result.output_tokens
        session.last_finish_s = result.finished_s
        return session

    def classes_seen(self) -> int:
        """How many classes have sent calls here (one: no call is ever of a higher class)."""
        return len(self.ranks)

    def in_gap(self, now_s: float, stale_window_s: float) -> list[NodeSession]:
        """Sessions in a tool gap: nothing queued or running here, their last call ended within
        ``stale_window_s`` of ``now_s``."""
        stale = now_s - stale_window_s
        return [
            s
            for s in self.sessions.values()
            if not s.pending and s.last_finish_s is not None and s.last_finish_s >= stale
        ]

    def live_counts(self, now_s: float, stale_window_s: float) -> dict[str, int]:
        """Per model: sessions with a call here now, or in a tool gap (``in_gap``)."""
        live: dict[str, int] = {}
        pending = [s for s in self.sessions.values() if s.pending]
        for session in pending + self.in_gap(now_s, stale_window_s):
            live[session.model] = live.get(session.model, 0) + 1
        return live

    def tenant_weights(self, now_s: float, stale_window_s: float) -> dict[str, float]:
        """Per tenant with a session that has a call here now or is in a tool gap
        (``in_gap``): its weight, as its latest session's call said."""
        weights: dict[str, float] = {}
        pending = [s for s in self.sessions.values() if s.pending]
        for session in pending + self.in_gap(now_s, stale_window_s):
            weights[session.tenant] = session.tenant_weight
        return weights
