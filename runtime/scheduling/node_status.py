"""The status snapshot of one node that routing reads (``core.status.InstanceStatus``): per
model its residency, queue, live sessions and when its next slot could begin; per session where
its KV is and what getting it back would cost; the node's queue, running calls, KV use,
holds and latest slots. It reads each part through its owner (state.py's table) and
changes nothing.

Its cost does not grow with the sessions the node knows (issue 46: rebuilt from every session
on each refresh, it was 42 % of a call's cost at 12,000 live sessions): the live sessions per
model are counters (sessions.py), and the sessions' KV map is kept from the entries that
changed since the last snapshot (``NodeMemory.watch``), one ``SessionKvStatus`` built per
change; a snapshot after changes copies the map (a C-level dict copy, ~80 µs at 12,000
entries), one without reuses the last. A real engine's own KV (``OwnKv.session_kv``: at most
its remembered sessions) is still read whole."""

from __future__ import annotations

from collections.abc import Mapping

from talaria.core.status import (
    RECENT_SLOTS,
    InstanceStatus,
    ModelResidency,
    ModelState,
    SessionKvStatus,
    SlotView,
    TenantShare,
)
from talaria.core.types import KvSource
from talaria.runtime.memory.resources import KvLocation
from talaria.runtime.scheduling.intake import Intake
from talaria.runtime.scheduling.loop import SlotLoop
from talaria.runtime.scheduling.sessions import SessionsView
from talaria.runtime.scheduling.state import NodeContext


class StatusReader:
    """Reads a node's parts into its ``InstanceStatus``: the queues from the intake, the slot
    and the holds from the slot loop, the sessions through their view."""

    def __init__(
        self, context: NodeContext, intake: Intake, loop: SlotLoop, sessions: SessionsView
    ) -> None:
        self.context = context
        self.intake = intake
        self.loop = loop
        self.sessions = sessions
        self._changed = context.memory.watch()
        self._kv: dict[str, SessionKvStatus] = {}
        """The KV map, kept up to date from ``_changed``."""
        self._published: dict[str, SessionKvStatus] | None = None
        """The copy the latest snapshot holds (never changed once handed out)."""
        self.built = 0
        """``SessionKvStatus`` entries built so far (what a refresh costs, for tests)."""

    def status(self) -> InstanceStatus:
        """The snapshot at the clock's now (core/status.py)."""
        ctx = self.context
        slot, memory = self.loop.slot, ctx.memory
        now = ctx.clock.now()
        waiting = self.intake.waiting_counts()
        live = self.sessions.live_counts(now, ctx.stale_window_s())
        models = {
            name: ModelResidency(
                model=name,
                state=(
                    ModelState.ACTIVE
                    if name in slot.resident
                    else ModelState.STAGED
                    if engine.staging
                    else ModelState.HOST
                ),
                next_slot_in_s=self.next_slot_in_s(name, now, waiting),
                staged_fraction=engine.staged_fraction,
                switch_s=engine.switch_in_s(),
                waiting_calls=waiting[name],
                live_sessions=live.get(name, 0),
            )
            for name, engine in ctx.engines.items()
            if engine.fault() is None  # a faulty engine's model is left out (``Health``)
        }
        sessions = self.kv_map()
        copied = False
        for name, engine in ctx.engines.items():
            # KV a real engine keeps in its own pool, for the sessions still live here
            for session_key, (tokens, source) in engine.session_kv().items():
                if session_key in sessions or session_key not in self.sessions:
                    continue
                if not copied:
                    sessions, copied = dict(sessions), True
                in_hbm = source is KvSource.HBM
                location = KvLocation.HBM if in_hbm else KvLocation.HOST
                sessions[session_key] = SessionKvStatus(
                    location=location.value,
                    tokens=tokens,
                    model=name,
                    restore_s=0.0 if in_hbm else engine.kv_restore_s(tokens),
                    recompute_s=engine.recompute_s(tokens),
                )
        kv_room = (
            memory.hbm_capacity_bytes - sum(memory.weights.values()) - sum(memory.staged.values())
        )
        return InstanceStatus(
            instance=ctx.name,
            at_s=now,
            active_model=slot.active,
            models=models,
            sessions=sessions,
            # the status's ``reserved`` (a kept name): each hold's budget; a learned hold's
            # extension holds none (core/holds.py)
            reserved={
                r.session_key: r.held_bytes if r.keeps_slot(now) else 0.0
                for r in self.loop.holds.live.values()
            },
            waiting_calls=sum(waiting.values()),
            waiting_prompt_tokens=sum(
                w.request.prompt_tokens for q in self.intake.waiting.values() for w in q
            ),
            running_calls=sum(e.running for e in ctx.engines.values()),
            kv_utilization=min(1.0, memory.hbm_kv_bytes / kv_room) if kv_room > 0 else 1.0,
            recent_slots=[
                SlotView(
                    model=s.model,
                    start_s=s.start_s,
                    switch_s=s.switch_s,
                    end_s=s.end_s,
                    close=None if s.close is None else s.close.value,
                    admitted=s.admitted,
                )
                for s in slot.records[-RECENT_SLOTS:]
            ],
            tenants=self.tenants(now),
            gap_models=self.sessions.gap_figures(),
        )

    def kv_map(self) -> dict[str, SessionKvStatus]:
        """Session → where its KV is in ``NodeMemory`` and what reusing it costs: the entries
        that changed since the last call rebuilt, the rest as they were (module docstring)."""
        if self._changed:
            memory, engines = self.context.memory, self.context.engines
            for key in self._changed:
                entry = memory.kv.get(key)
                engine = engines.get(entry.model) if entry is not None else None
                if entry is None or engine is None:
                    self._kv.pop(key, None)
                    continue
                in_hbm = entry.location is KvLocation.HBM
                self._kv[key] = SessionKvStatus(
                    location=entry.location.value,
                    tokens=entry.tokens,
                    model=entry.model,
                    restore_s=0.0 if in_hbm else engine.kv_restore_s(entry.tokens),
                    recompute_s=engine.recompute_s(entry.tokens),
                )
                self.built += 1
            self._changed.clear()
            self._published = None
        if self._published is None:
            self._published = dict(self._kv)
        return self._published

    def tenants(self, now: float) -> dict[str, TenantShare]:
        """Per tenant that has called here: its service so far, its calls waiting and
        running, its oldest call's wait (the intake's accounts and queues)."""
        accounts = self.intake.accounts
        queues = self.intake.tenant_queues(now)
        names = set(accounts.served) | set(accounts.running) | set(queues)
        return {
            tenant: TenantShare(
                served_s=accounts.served.get(tenant, 0.0),
                waiting_calls=queues.get(tenant, (0, 0.0))[0],
                running_calls=accounts.running.get(tenant, 0),
                oldest_wait_s=queues.get(tenant, (0, 0.0))[1],
            )
            for tenant in sorted(names)
        }

    def next_slot_in_s(self, model: str, now: float, waiting: Mapping[str, int]) -> float:
        """0 if resident; else the rest of the slot, a quantum + switch for each model ahead
        in round-robin order with waiting calls, and this model's own switch."""
        ctx, slot = self.context, self.loop.slot
        if model in slot.resident:
            return 0.0
        order = ctx.order
        wait = 0.0
        start = 0
        if slot.active is not None:
            wait = max(0.0, slot.deadline_s() - now)
            start = order.index(slot.active) + 1
        for i in range(len(order)):
            ahead = order[(start + i) % len(order)]
            if ahead == model:
                break
            if ahead not in slot.resident and waiting.get(ahead, 0) > 0:
                wait += ctx.config.quantum_s + ctx.engines[ahead].switch_in_s()
        return wait + ctx.engines[model].switch_in_s()
