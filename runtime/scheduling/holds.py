"""The holds on one node and the KV pins they keep (the ``soft_reservations`` flag; the flag,
the status's ``reserved`` and the replay document's ``reservations`` keep the older name).

After a call that ends in a tool gap expected to close before its slot's deadline, the session
holds the HBM bytes its next call will need and pins its KV (LRU eviction skips it) until it
returns, moves, ends, its slot closes, or the hold expires at
``now + max(2·gap, gap + 1 s)`` (``core.holds.plan_hold``). With
``learned_gaps``, a session without a hint holds its KV at least until the q-quantile of its
learned log-normal gap (core/gaps.py), while the hold keeps the slot open only for the
mean rule's hold (``Hold.slot_until_s``).

Each release with the node's clock adds the budget's byte-seconds to the table's
``held_byte_s`` and the pinned KV's to ``pinned_byte_s`` (core/holds.py; the replay's
memory-seconds held). A learned hold's extension, past ``slot_until_s``, keeps the pin but not
the budget: admission leaves it out (loop.py's admission view passes the node's time).

Holds are claims on memory: when another tenant's call does not fit, the holds past their
tenant's share of the node, then those held past a few mean gaps of their session, are released
for it (``make_room``; the rules are hold_caps.py's).

The slot loop (loop.py) owns the node's ``KvHolds``: the node's session events reach it through
``SlotLoop.hold`` / ``release_hold``, the intake's need of room through its admission view.
"""

from __future__ import annotations

from collections.abc import Callable

from talaria.core.clock import Clock
from talaria.core.gap_model import DEFAULT_GAP_PRIOR_S
from talaria.core.holds import HoldTable, ReleaseReason, plan_hold
from talaria.core.types import DEFAULT_TENANT, CallRequest, CallResult
from talaria.runtime.memory.resources import KvLocation, NodeMemory
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.hold_caps import HeldKv, yielding
from talaria.runtime.scheduling.sessions import NodeSession, SessionsView


class KvHolds:
    """The node's hold table, kept in step with the pins on the sessions' KV; with
    ``sessions`` (the node's), its holds yield to other tenants' calls (``make_room``)."""

    def __init__(
        self,
        memory: NodeMemory,
        clock: Clock | None = None,
        sessions: SessionsView | None = None,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.memory = memory
        self.table = HoldTable()
        self._clock = clock
        self._sessions = sessions
        self._config = config or SchedulerConfig()

    def release(self, session_key: str, reason: ReleaseReason) -> None:
        """Release the session's hold, if it has one, and unpin its KV."""
        now = self._clock.now() if self._clock is not None else None
        if self.table.release(session_key, reason, now) is not None:
            entry = self.memory.kv.get(session_key)
            if entry is not None and entry.pins > 0:
                entry.pins -= 1

    def release_model(self, model: str) -> None:
        """The model's slot closed (or its weights need the room): release its holds."""
        for hold in self.table.for_model(model):
            self.release(hold.session_key, ReleaseReason.SLOT_CLOSED)

    def expire(self, now_s: float) -> None:
        """Release the holds whose expiry has passed."""
        for hold in self.table.expired(now_s):
            self.release(hold.session_key, ReleaseReason.EXPIRED)

    def hold(
        self,
        result: CallResult,
        session: NodeSession,
        engine: DrivenEngine,
        *,
        expected_gap_s: float,
        deadline_s: float | None,
        default_output_tokens: int,
        hold_gap_s: float | None = None,
    ) -> None:
        """Hold for the session after its call ``result`` (``deadline_s``: its slot's, when
        the slot is contended). Held bytes = kv_bytes(tokens + expected growth) − the bytes its
        KV already has; an engine that keeps its own KV (vLLM) leaves no entry, so 0 is held.
        Nothing when its KV already left HBM. A hold replacing the session's live one (two of
        its calls ran at once and both finished) keeps that one's pin: one pin per hold, or
        the KV would stay pinned for good once they are released.
        ``hold_gap_s``: how long to hold (``learned_gaps``); None: the slack rule."""
        entry = self.memory.kv.get(result.session_key)
        if entry is not None and entry.location is not KvLocation.HBM:
            return  # its KV already left HBM: nothing to hold
        held = 0.0
        if entry is not None:
            growth = session.expected_growth_tokens(default_output_tokens)
            held = engine.kv_bytes(entry.tokens + growth) - entry.nbytes
        plan = plan_hold(
            session_key=result.session_key,
            model=result.model,
            now_s=result.finished_s,
            expected_gap_s=expected_gap_s,
            held_bytes=held,
            deadline_s=deadline_s,
            hold_gap_s=hold_gap_s,
            pinned_bytes=0.0 if entry is None else entry.nbytes,
        )
        if plan is not None:
            replaced = result.session_key in self.table.live
            self.table.add(plan)
            if entry is not None and not replaced:
                entry.pins += 1

    # -- what other tenants may take (hold_caps.py) ------------------------------------------
    def held_kv(self, now_s: float) -> list[HeldKv]:
        """The live holds as the caps read them: each one's tenant, the HBM it keeps
        (its session's KV in HBM, plus its budget while it keeps its slot) and its session's
        mean gap (the prior for a session the node no longer knows)."""
        found = []
        for hold in self.table.live.values():
            session = self._sessions.get(hold.session_key) if self._sessions else None
            entry = self.memory.kv.get(hold.session_key)
            pinned = entry.nbytes if entry and entry.location is KvLocation.HBM else 0.0
            budget = hold.held_bytes if hold.keeps_slot(now_s) else 0.0
            found.append(
                HeldKv(
                    hold.session_key,
                    session.tenant if session is not None else DEFAULT_TENANT,
                    pinned + budget,
                    hold.created_s,
                    hold.expected_return_s,
                    session.gaps.expected_s() if session is not None else DEFAULT_GAP_PRIOR_S,
                )
            )
        return found

    def make_room(self, request: CallRequest, fits: Callable[[], bool], now_s: float) -> bool:
        """``request`` does not fit: release the other tenants' holds that yield to it
        (``hold_caps.yielding``: past their share, then stale), one at a time, until
        ``fits()``; whether it fits then. Nothing is released for a call whose tenant is
        alone in holding, or on a node that does not know its sessions."""
        if self._sessions is None:
            return False
        holds = self.held_kv(now_s)
        if all(h.tenant == request.tenant for h in holds):
            return False
        config = self._config
        weights = self._sessions.tenant_weights(now_s, config.stale_after_quanta * config.quantum_s)
        weights.setdefault(request.tenant, request.tenant_weight)
        room = self.memory.hbm_capacity_bytes - sum(self.memory.weights.values())
        order = yielding(holds, request.tenant, weights, room, now_s, config.stale_hold_gaps)
        for session_key, reason in order:
            self.release(session_key, reason)
            if fits():
                return True
        return bool(order) and fits()
