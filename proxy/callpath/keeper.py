"""A session's life around its calls: its route preference (released when the session comes
back, taken when a reply asks for tools or the client hints a gap), hints, and its end (the
client's, an admin's, a final call's, or idleness), each with its records and metrics.

When to prefer an instance, for how long, and how a preference ends are
``core.preferences.SessionPreferences``' (the same rules as the simulator's cluster
replay); here: their records and metrics, in wall seconds (``ReservationRecord``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from talaria.core.calls import ModelOutput
from talaria.core.clock import Clock, TimeScale
from talaria.core.preferences import RoutePreference, SessionPreferences, Settled
from talaria.proxy.callpath.recorder import Recorder
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.records import HintRecord, ReservationRecord
from talaria.proxy.runtimes.pool import RuntimePool
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.state import SessionState, Thread, split_runtime_key
from talaria.proxy.sessions.tenancy import DEFAULT_MAX_PER_TENANT, DEFAULT_MAX_THREADS

log = logging.getLogger("talaria.proxy")


class SessionKeeper:
    """Keeps ``sessions`` and their route ``preferences`` between calls (module docstring);
    ``idle_timeout_s``: clock seconds without a call after which a session ends. The
    gateway resolves calls' sessions in its book; the session routes (hints, ends) and the
    admin API reach it as the app's ``keeper`` service (:func:`session_keeper`)."""

    def __init__(
        self,
        sessions: SessionBook,
        preferences: SessionPreferences,
        recorder: Recorder,
        pool: RuntimePool,
        clock: Clock,
        time: TimeScale,
        idle_timeout_s: float,
    ) -> None:
        self.sessions = sessions
        self.preferences = preferences
        self._recorder = recorder
        self._metrics = recorder.metrics
        self._pool = pool
        self._clock = clock
        self._time = time
        self.idle_timeout_s = idle_timeout_s
        self.served_elsewhere: Callable[[SessionState], Awaitable[bool]] | None = None
        """With replicas: whether another replica served an idle session since this one did
        (then the sweep forgets it instead of ending it; proxy/cluster/handoff.py)."""
        self._tasks: set[asyncio.Task[None]] = set()

    # -- around a call ------------------------------------------------------------------------
    async def routed(
        self, state: SessionState, instance: str, now_s: float, now_at: datetime, thread: int = 0
    ) -> None:
        """The session's call (of ``thread``) goes to ``instance``: a preference it held is
        settled (a hit if it came back to the preferred instance), and the instance the thread
        left is told."""
        settled = self.preferences.started(
            state.runtime_key(thread), instance, now_s, concurrent=state.inflight > 0
        )
        if settled is not None:
            self._metrics.preferences.labels(settled.value).inc()
            reason = "expired" if settled is Settled.EXPIRED else "returned"
            self._release(state, thread, reason, now_at)
        held = state.threads.get(thread)
        left = held.last_instance if held is not None else None
        if held is not None:
            held.instances.add(instance)
        if left is not None and left != instance:
            await self._pool[left].session_moved(state.runtime_key(thread))

    def replied(
        self, call: PreparedCall, state: SessionState, conversation: Conversation, instance: str,
        output: ModelOutput, thread: int = 0,
    ) -> None:  # fmt: skip
        """The call's reply came from ``instance``: its thread continues from it (unless the
        session ended while the call ran)."""
        state.last_instance = instance
        if (held := state.threads.get(thread)) is not None:
            held.last_instance = instance
        state.last_finish_reason = output.finish_reason
        if call.content.messages is not None and not state.ended:
            reply = fingerprint(output.as_message())
            self.sessions.call_finished(state, conversation, reply, self._clock.now(), thread)

    def after_call(
        self, call: PreparedCall, state: SessionState, instance: str, output: ModelOutput,
        finished_at: datetime, thread: int = 0,
    ) -> None:  # fmt: skip
        """After the call's records: end the session if the call was its last, else take a
        preference when the reply asks for tools (or the client hinted a gap); then the
        session's record. A session that ended while the call ran stays ended: nothing more
        of it is kept (no preference, no session record that would reopen it)."""
        if state.ended:
            return
        single = call.content.messages is None and not call.identity.explicit
        final = call.identity.final or single
        taken = self.preferences.finished(
            state.runtime_key(thread),
            instance,
            self._clock.now(),
            final=final,
            asks_tools=bool(output.tool_calls) or output.finish_reason == "tool_calls",
            hint_s=self._time.clock(call.identity.tool_gap_hint_s),
        )
        if final:  # this call's thread ends on ``instance`` with the call; the rest here
            ends = self._ends(state, list(state.threads.values()), skip=(thread, instance))
            if ends:
                self._spawn(self._send_ends(ends))
            self.end(state, "final", finished_at)
            return
        if taken is not None:
            self._taken(state, thread, taken, finished_at)
        self._recorder.session(state, finished_at)

    def call_ended(self, state: SessionState, thread: int) -> None:
        """A call of the session's ``thread`` is over, whatever its outcome."""
        self.sessions.call_ended(state, thread)

    def thread_retired(self, state: SessionState, thread: Thread) -> None:
        """The book retired ``thread`` of the live ``state`` (book.py: past the session's
        bound of threads): its preference is released (``retired``), its learned gaps
        forgotten, and its runtime entry ended (its KV may go)."""
        now_at = datetime.now(UTC)
        if thread.preference is not None:
            self._recorder.submit(
                replace(thread.preference, released_at=now_at, release_reason="retired")
            )
            thread.preference = None
            self._metrics.preferences.labels("ended").inc()
        self.preferences.end(state.runtime_key(thread.number))
        ends = self._ends(state, [thread])
        if ends:
            self._spawn(self._send_ends(ends))

    # -- route preferences --------------------------------------------------------------------
    def _taken(
        self, state: SessionState, thread: int, held: RoutePreference, now_at: datetime
    ) -> None:
        """Record a preference just taken by ``thread`` (releasing the one it replaces)."""
        self._release(state, thread, "replaced", now_at)
        wall = self._time.wall
        record = ReservationRecord(  # stored as a reservation row
            reservation_id=uuid.uuid4().hex,
            session_key=state.key,
            instance=held.instance,
            held_bytes=0.0,
            created_at=now_at,
            expected_return_at=now_at + timedelta(seconds=wall(held.expected_gap_s)),
            expires_at=now_at + timedelta(seconds=wall(held.expires_s - held.created_s)),
        )
        state.threads[thread].preference = record
        self._metrics.preferences.labels("taken").inc()
        self._recorder.submit(record)

    def _release(self, state: SessionState, thread: int, reason: str, now_at: datetime) -> bool:
        """Record the release of ``thread``'s preference; False if it had none recorded."""
        held = state.threads.get(thread)
        if held is None or held.preference is None:
            return False
        self._recorder.submit(replace(held.preference, released_at=now_at, release_reason=reason))
        held.preference = None
        return True

    async def sweep(self) -> None:
        """Release expired preferences; end sessions idle beyond the timeout; send again the
        ends a runtime did not take (proxy/runtimes/notices.py)."""
        now_s, now_at = self._clock.now(), datetime.now(UTC)
        for held in self.preferences.sweep(now_s):
            key, thread = split_runtime_key(held.session)
            state = self.sessions.get(key)
            if state is not None and self._release(state, thread, "expired", now_at):
                self._metrics.preferences.labels("expired").inc()
        for state in self.sessions.idle(now_s, self.idle_timeout_s):
            if self.served_elsewhere is not None and await self._asked(state):
                self.sessions.forget(state)
                continue
            await self._end_on_runtime(state)
            self.end(state, "idle", now_at)
        await self._pool.resend_ends()

    async def _asked(self, state: SessionState) -> bool:
        """``served_elsewhere(state)``; False when the store cannot say (the session ends)."""
        assert self.served_elsewhere is not None
        try:
            return await self.served_elsewhere(state)
        except Exception as exc:
            log.warning("session %s: could not ask the store who served it: %r", state.key, exc)
            return False

    # -- hints and ends -----------------------------------------------------------------------
    async def hint(
        self, session_id: str, tenant_id: str, expected_s: float | None, tool: str | None
    ) -> bool:
        """Record a tool-gap hint (``expected_s`` in wall seconds); the session prefers its last
        instance. False: no live session of that id for this tenant."""
        now_at = datetime.now(UTC)
        state = self.sessions.named(tenant_id, session_id)
        if state is None or state.ended:
            return False
        self._recorder.submit(HintRecord(state.key, now_at, expected_s, tool))
        expected = self._time.clock(expected_s)
        last = state.last_thread
        if last is not None and last.last_instance is not None and expected is not None:
            await self._pool[last.last_instance].hint(state.runtime_key(last.number), expected)
            taken = self.preferences.hint(
                state.runtime_key(last.number), self._clock.now(), expected,
                concurrent=state.inflight > 0,
            )  # fmt: skip
            if taken is not None:
                self._taken(state, last.number, taken, now_at)
        return True

    async def end_session(
        self, key_or_id: str, reason: str, tenant_id: str | None
    ) -> SessionState | None:
        """End a live session and its children: ``key_or_id`` is the client's id of it (or its
        key); with ``tenant_id`` None (the admin) its key, or a client's id that only one
        tenant uses. The session ended, or None if there is no such live session."""
        if tenant_id is None:
            state = self.sessions.get(key_or_id)
            if state is None:
                named = self.sessions.by_session_id(key_or_id)
                if len(named) > 1:
                    keys = ", ".join(s.key for s in named)
                    raise ApiError(
                        409,
                        f"Several tenants have a live session {key_or_id!r}; end one by its "
                        f"key ({keys}).",
                        code="ambiguous_session",
                    )
                state = named[0] if named else None
        else:
            state = self.sessions.named(tenant_id, key_or_id)
        if state is None or state.ended:
            return None
        now_at = datetime.now(UTC)
        for child in [*self.sessions.children(state.key), state]:
            self._recorder.submit(HintRecord(child.key, now_at, None, None, kind="end"))
            await self._end_on_runtime(child)
            self.end(child, reason, now_at)
        return state

    async def _end_on_runtime(self, state: SessionState) -> None:
        """Tell every instance that served a thread of the session that the thread ended (its
        entry, KV and accounts there go)."""
        await self._send_ends(self._ends(state, list(state.threads.values())))

    @staticmethod
    def _ends(
        state: SessionState, threads: list[Thread], skip: tuple[int, str] | None = None
    ) -> dict[str, list[str]]:
        """Instance → the runtime keys of ``threads`` it served (``skip``: a thread and the
        instance that ended it already)."""
        ends: dict[str, list[str]] = {}
        for thread in threads:
            served = set(thread.instances)
            if thread.last_instance is not None:  # a session taken over: its KV's instance
                served.add(thread.last_instance)
            for instance in served:
                if skip != (thread.number, instance):
                    ends.setdefault(instance, []).append(state.runtime_key(thread.number))
        return ends

    async def _send_ends(self, ends: dict[str, list[str]]) -> None:
        """One request per instance (``RuntimeClient.end_sessions``), all at once."""
        runtimes = [(self._pool.get(name), keys) for name, keys in ends.items()]
        await asyncio.gather(*(r.end_sessions(keys) for r, keys in runtimes if r is not None))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in a task of its own (kept until done; a failure is logged)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("ending a session's threads on the runtime failed: %r", task.exception())

    def end(self, state: SessionState, reason: str, now_at: datetime) -> None:
        """End the session for ``reason``: release its preferences, observe its completion
        time, forget it, and record its end."""
        for thread in state.threads.values():
            if self._release(state, thread.number, "ended", now_at):
                self._metrics.preferences.labels("ended").inc()
        self._metrics.sct.labels(state.model).observe(
            self._time.wall(self._clock.now() - state.started_s)
        )
        self.sessions.forget(state)
        self._recorder.session(state, now_at, ended_reason=reason)
        self._metrics.live_sessions.set(len(self.sessions))


def session_keeper(
    recorder: Recorder,
    pool: RuntimePool,
    clock: Clock,
    time: TimeScale,
    *,
    idle_timeout_s: float,
    max_sessions_per_tenant: int = DEFAULT_MAX_PER_TENANT,
    max_threads_per_session: int = DEFAULT_MAX_THREADS,
) -> SessionKeeper:
    """A keeper with a book of its own (proxy/sessions/book.py: at most
    ``max_sessions_per_tenant`` live sessions a tenant, ``max_threads_per_session`` threads a
    session; a retired thread's preference released and its entry ended on its runtime) and
    its route preferences; ``idle_timeout_s``: wall seconds without a call after which a
    session ends. The app's ``keeper`` service (proxy/edge/services.py)."""
    preferences = SessionPreferences()
    sessions = SessionBook(
        on_forget=preferences.end,
        max_per_tenant=max_sessions_per_tenant,
        max_threads=max_threads_per_session,
        on_retire=lambda state, thread: keeper.thread_retired(state, thread),
    )
    keeper = SessionKeeper(
        sessions,
        preferences,
        recorder,
        pool,
        clock,
        time,
        idle_timeout_s=time.clock(idle_timeout_s),
    )
    return keeper
