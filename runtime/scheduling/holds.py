"""Soft reservations on one node and the KV pins they hold (the ``soft_reservations`` flag).

After a call that ends in a tool gap expected to close before its slot's deadline, the session
holds the HBM bytes its next call will need and pins its KV (LRU eviction skips it) until it
returns, moves, ends, its slot closes, or the reservation expires at
``now + max(2·gap, gap + 1 s)`` (``core.reservations.plan_reservation``). With
``learned_gaps``, a session without a hint holds its KV at least until the q-quantile of its
learned log-normal gap (core/gaps.py), while the reservation keeps the slot open only for the
mean rule's hold (``Reservation.slot_until_s``).

Each release with the node's clock adds the budget's byte-seconds to the table's
``held_byte_s`` and the pinned KV's to ``pinned_byte_s`` (core/reservations.py; the replay's
memory-seconds held). A learned hold's extension, past ``slot_until_s``, keeps the pin but not
the budget: admission leaves it out (loop.py's admission view passes the node's time).

The slot loop (loop.py) owns the node's ``KvHolds``: the node's session events reach it through
``SlotLoop.reserve`` / ``release_hold``.
"""

from __future__ import annotations

from talaria.core.clock import Clock
from talaria.core.reservations import ReleaseReason, ReservationTable, plan_reservation
from talaria.core.types import CallResult
from talaria.runtime.engine import Engine
from talaria.runtime.scheduling.resources import KvLocation, NodeMemory
from talaria.runtime.scheduling.sessions import NodeSession


class KvHolds:
    """The node's reservation table, kept in step with the pins on the sessions' KV."""

    def __init__(self, memory: NodeMemory, clock: Clock | None = None) -> None:
        self.memory = memory
        self.table = ReservationTable()
        self._clock = clock

    def release(self, session_key: str, reason: ReleaseReason) -> None:
        """Release the session's reservation, if it has one, and unpin its KV."""
        now = self._clock.now() if self._clock is not None else None
        if self.table.release(session_key, reason, now) is not None:
            entry = self.memory.kv.get(session_key)
            if entry is not None and entry.pins > 0:
                entry.pins -= 1

    def release_model(self, model: str) -> None:
        """The model's slot closed (or its weights need the room): release its reservations."""
        for res in self.table.for_model(model):
            self.release(res.session_key, ReleaseReason.SLOT_CLOSED)

    def expire(self, now_s: float) -> None:
        """Release the reservations whose expiry has passed."""
        for res in self.table.expired(now_s):
            self.release(res.session_key, ReleaseReason.EXPIRED)

    def hold(
        self,
        result: CallResult,
        session: NodeSession,
        engine: Engine,
        *,
        expected_gap_s: float,
        deadline_s: float | None,
        default_output_tokens: int,
        hold_gap_s: float | None = None,
    ) -> None:
        """Reserve for the session after its call ``result`` (``deadline_s``: its slot's, when
        the slot is contended). Held bytes = kv_bytes(tokens + expected growth) − the bytes its
        KV already has; an engine that keeps its own KV (vLLM) leaves no entry, so 0 is held.
        Nothing when its KV already left HBM. A reservation replacing the session's live one
        (two of its calls ran at once and both finished) keeps that one's pin: one pin per
        reservation, or the KV would stay pinned for good once they are released.
        ``hold_gap_s``: how long to hold (``learned_gaps``); None: the slack rule."""
        entry = self.memory.kv.get(result.session_key)
        if entry is not None and entry.location is not KvLocation.HBM:
            return  # its KV already left HBM: nothing to hold
        held = 0.0
        if entry is not None:
            growth = session.expected_growth_tokens(default_output_tokens)
            held = engine.kv_bytes(entry.tokens + growth) - entry.nbytes
        plan = plan_reservation(
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
