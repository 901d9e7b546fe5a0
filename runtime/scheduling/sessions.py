"""The node's view of the sessions it serves (``NodeSessions``, one ``NodeSession`` each): their
calls here, their KV use (context and growth) and their expected tool gaps; the inputs of SP
admission (is a call a continuation, how long will it decode), of holds (the expected gap and
KV growth) and of demand (who is in a tool gap and due back).

``lifecycle.SessionLifecycle`` owns it and alone changes it; the slot loop and the status reader
read it through ``SessionsView``.

Nothing here is a scan of every session the node knows (issue 46: the status and the slot
policy walked them all, so a call's cost grew with the live sessions): the sessions are kept
in order of their last call here (``expired`` walks only the idle ones), the sessions with a
call queued or running are counted per model as they come and go, and those in a tool gap
are an index by the time their last call finished (``GapIndex``: ``in_gap`` visits the
sessions in a gap within the window, ``live_counts`` reads counters).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from talaria.core.gap_model import (
    LOG_NORMAL,
    MEAN,
    GapFigures,
    GapQuality,
    LogNormalGaps,
    MeanGaps,
)
from talaria.core.gaps import DEFAULT_QUANTILE, GapPrediction, PopulationGaps
from talaria.core.types import DEFAULT_TENANT, CallRequest, CallResult


@dataclass
class NodeSession:
    """One session's history on this node."""

    model: str
    calls: int = 0
    """Calls of the session finished here (> 0: its next call is a continuation)."""
    last_finish_s: float | None = None
    gaps: MeanGaps = field(default_factory=MeanGaps)
    """Its mean-rule gap model (core/gap_model.py)."""
    learned: LogNormalGaps | None = None
    """Its log-normal gap model, for ``learned_gaps`` (core/gap_model.py); None: off."""
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
    last_seen_s: float = 0.0
    """When its latest call here arrived or finished (clock seconds)."""
    ended: bool = False
    """Ended while a call of it was here: forgotten when the last one settles."""

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

    def gap_figures(self) -> dict[str, GapFigures]:
        """Per gap model: how well it predicted (``NodeSessions.gap_figures``)."""
        ...


class GapIndex:
    """The sessions in a tool gap (nothing queued or running, a call finished), by the time
    their last call finished: a heap of (finish, entry number, key) whose stale entries are
    skipped (an entry is live while the key's member entry has its number), and per model
    how many are members. ``prune(stale_s)`` drops the members that finished before it."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self.members: dict[str, tuple[int, str]] = {}
        """Key → (its entry number, its model)."""
        self.counts: dict[str, int] = {}
        """Model → members."""
        self._numbers = itertools.count()

    def enter(self, session_key: str, model: str, finished_s: float) -> None:
        """The session is in a gap since its call finished at ``finished_s``."""
        self.leave(session_key)
        number = next(self._numbers)
        self.members[session_key] = (number, model)
        self.counts[model] = self.counts.get(model, 0) + 1
        heapq.heappush(self._heap, (finished_s, number, session_key))
        if len(self._heap) > 2 * len(self.members) + 1024:  # mostly left entries: compact
            self._heap = [e for e in self._heap if self.members.get(e[2], (-1,))[0] == e[1]]
            heapq.heapify(self._heap)

    def leave(self, session_key: str) -> None:
        """The session is no longer in a gap (a call came, or it ended)."""
        member = self.members.pop(session_key, None)
        if member is not None:
            self.counts[member[1]] -= 1

    def prune(self, stale_s: float) -> None:
        """Drop the members whose last call finished before ``stale_s``."""
        heap = self._heap
        while heap and heap[0][0] < stale_s:
            _, number, key = heapq.heappop(heap)
            member = self.members.get(key)
            if member is not None and member[0] == number:
                self.leave(key)


class NodeSessions:
    """The sessions of one node by key (``CallRequest.session_key``), in order of their latest
    call's arrival or finish here (module docstring)."""

    def __init__(
        self, population: PopulationGaps | None = None, quantile: float = DEFAULT_QUANTILE
    ) -> None:
        self.sessions: OrderedDict[str, NodeSession] = OrderedDict()
        self.ranks: dict[int, int] = {}
        """Calls that arrived here per class."""
        self.population = population
        """``learned_gaps``: the node's log-normal gap fits by (tenant, model, agent); None:
        off."""
        self.quality = {MEAN: GapQuality(quantile)}
        """Per gap model the node keeps (the mean, and the log-normal with ``learned_gaps``):
        how well it predicted each observed gap (core/gap_model.py ``GapQuality``, to
        ``quantile``: ``SchedulerConfig.gap_quantile``)."""
        if population is not None:
            self.quality[LOG_NORMAL] = GapQuality(quantile)
        self._busy: dict[str, int] = {}
        """Model → sessions with a call queued or running here."""
        self._gap = GapIndex()

    def __contains__(self, session_key: str) -> bool:
        return session_key in self.sessions

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_key: str) -> NodeSession | None:
        """The session, or None if this node does not know it."""
        return self.sessions.get(session_key)

    def get_or_add(self, session_key: str, model: str) -> NodeSession:
        """The session, created on its first call (or on a call queued before it ended)."""
        session = self.sessions.get(session_key)
        if session is None:
            session = self.sessions[session_key] = NodeSession(model)
            if self.population is not None:
                session.learned = LogNormalGaps(self.population, session.population)
        return session

    def forget(self, session_key: str) -> None:
        """The session ended: drop what the node knew of it."""
        session = self.sessions.pop(session_key, None)
        if session is not None and session.pending:
            self._busy[session.model] -= 1
        self._gap.leave(session_key)

    def touch(self, session_key: str, now_s: float) -> None:
        """The session counts as seen at ``now_s`` (it moves to the end of the order)."""
        session = self.sessions.get(session_key)
        if session is not None:
            session.last_seen_s = now_s
            self.sessions.move_to_end(session_key)

    def expired(self, now_s: float, idle_s: float) -> list[str]:
        """The sessions with nothing queued or running here and no call for ``idle_s``
        (``SchedulerConfig.forget_idle_s``), oldest first: a walk of the idle ones only. One
        with a call here since before is counted as seen now."""
        idle: list[str] = []
        busy: list[str] = []
        for key, session in self.sessions.items():
            if now_s - session.last_seen_s <= idle_s:
                break
            (busy if session.pending else idle).append(key)
        for key in busy:
            self.touch(key, now_s)
        return idle

    def arrived(self, request: CallRequest, now_s: float) -> None:
        """A call of the session arrived: observe the gap since its last call ended and the
        tokens its prompt appended to that call's context, and count it pending."""
        session = self.get_or_add(request.session_key, request.model)
        if session.last_finish_s is not None:
            gap = now_s - session.last_finish_s
            self.quality[MEAN].judge(session.gaps, gap)  # the prediction made before it
            session.gaps.observe(gap)
            if session.learned is not None:
                self.quality[LOG_NORMAL].judge(session.learned, gap)
        if session.learned is not None:
            session.learned.key = (request.tenant, request.model, request.agent)
            if session.last_finish_s is not None:
                session.learned.observe(now_s - session.last_finish_s)
        if session.context_tokens:
            session.appended_tokens += max(0, request.prompt_tokens - session.context_tokens)
        if not session.pending:
            self._busy[session.model] = self._busy.get(session.model, 0) + 1
            self._gap.leave(request.session_key)
        session.pending += 1
        session.ended = False
        session.rank = request.priority.rank
        session.tenant, session.tenant_weight = request.tenant, request.tenant_weight
        session.agent = request.agent
        self.ranks[session.rank] = self.ranks.get(session.rank, 0) + 1
        self.touch(request.session_key, now_s)

    def predicted_gap(self, session: NodeSession, quantile: float) -> GapPrediction:
        """``learned_gaps``: the session's learned median gap and hold to ``quantile``
        (core/gaps.py), from its own gaps and its (tenant, model, agent) population's fit (the
        prior when off)."""
        learned = session.learned or LogNormalGaps(PopulationGaps(), session.population)
        return learned.prediction(quantile, touch=True)

    def gap_figures(self) -> dict[str, GapFigures]:
        """Per gap model the node keeps: how well it predicted (``quality``)."""
        return {name: quality.figures() for name, quality in self.quality.items()}

    def settled(self, session_key: str) -> NodeSession | None:
        """A call of the session left the node (finished, failed or withdrawn); the session
        if that was its last call here and it has ended (the caller forgets it)."""
        session = self.sessions.get(session_key)
        if session is None or session.pending <= 0:
            return None
        session.pending -= 1
        if session.pending:
            return None
        self._busy[session.model] -= 1
        if session.ended:
            return session
        if session.last_finish_s is not None:
            self._gap.enter(session_key, session.model, session.last_finish_s)
        return None

    def finished(self, result: CallResult) -> NodeSession | None:
        """Count a finished call (its output and context); None if the session is gone or
        has ended."""
        session = self.sessions.get(result.session_key)
        if session is None or session.ended:
            return None
        session.calls += 1
        session.output_tokens += result.output_tokens
        session.context_tokens = result.prompt_tokens + result.output_tokens
        session.last_finish_s = result.finished_s
        self.touch(result.session_key, result.finished_s)
        return session

    def classes_seen(self) -> int:
        """How many classes have sent calls here (one: no call is ever of a higher class)."""
        return len(self.ranks)

    def in_gap(self, now_s: float, stale_window_s: float) -> list[NodeSession]:
        """Sessions in a tool gap: nothing queued or running here, their last call ended within
        ``stale_window_s`` of ``now_s`` (the node's one window: ``NodeContext.stale_window_s``;
        those before it leave the index)."""
        self._gap.prune(now_s - stale_window_s)
        return [self.sessions[key] for key in self._gap.members]

    def live_counts(self, now_s: float, stale_window_s: float) -> dict[str, int]:
        """Per model: sessions with a call here now, or in a tool gap (``in_gap``); from
        counters, not a walk."""
        self._gap.prune(now_s - stale_window_s)
        live: dict[str, int] = {}
        for counts in (self._busy, self._gap.counts):
            for model, n in counts.items():
                if n:
                    live[model] = live.get(model, 0) + n
        return live

    def tenant_weights(self, now_s: float, stale_window_s: float) -> dict[str, float]:
        """Per tenant with a session that has a call here now or is in a tool gap
        (``in_gap``): its weight, as its latest session's call said."""
        weights: dict[str, float] = {}
        pending = [s for s in self.sessions.values() if s.pending]
        for session in pending + self.in_gap(now_s, stale_window_s):
            weights[session.tenant] = session.tenant_weight
        return weights
