"""The gateway: one LLM call from a prepared, identified request to a running task, read top to
bottom in :meth:`Gateway.open_call`, one step per function, each taking the call's context in
the gateway (proxy/callpath/stages.py ``GatewayCall``) and adding its part:

1. admit (``_admit``): the call's schemas, its context window, the shutdown, the store's
   room for its records, the tenant's calls in flight, and an instance that hosts its model;
2. place: with replicas, take over a session another replica held (proxy/cluster/handoff.py);
   the API layer has already forwarded a call whose owner is another replica;
3. resolve the session (``_resolve``: proxy/sessions/resolve.py, by the client's id or by the
   conversation it continues), and what of its prompt the session's KV already holds;
4. route (``_route``: core/routing/) over the status of the instances hosting the model;
   settle the session's route preference (proxy/callpath/keeper.py); record the decision;
5. run (``_run``: proxy/callpath/runner.py) in a task of its own; the runner records the outcome
   (proxy/callpath/recorder.py) and the keeper the session's route preference or end; an
   instance the call cannot reach is left for another (``_reroute``: steps 4 and 5 again).

The services it is given (the app's container starts them: proxy/edge/services.py): the
runtime pool (proxy/runtimes/pool.py), the recorder and the session keeper (its book of
sessions and their route preferences); its own parts: the runner and, with replicas, the
hand-off. Sessions idle for the keeper's ``idle_timeout_s`` end at a sweep. Time: the gateway
schedules on its ``Clock`` (clock seconds) and shows wall seconds; one ``TimeScale`` converts,
for every part. :func:`call_path` builds the services and the gateway in one go (a test's, a
bench's).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from talaria.core.clock import Clock, TimeScale
from talaria.core.routing import (
    NoInstanceError,
    RouteRequest,
    RoutingConfig,
    RoutingDecision,
    route,
)
from talaria.proxy.callpath.keeper import SessionKeeper, session_keeper
from talaria.proxy.callpath.recorder import Recorder, RecordSink
from talaria.proxy.callpath.runner import CallRunner, RunningCall, runtime_request
from talaria.proxy.callpath.schemas import SchemaCheck
from talaria.proxy.callpath.stages import GatewayCall, fit_window
from talaria.proxy.cluster.handoff import Adopt, Generation, Handoff, Owned
from talaria.proxy.contract.calls import SHUTDOWN, CallHandle, PreparedCall
from talaria.proxy.contract.errors import (
    ApiError,
    too_many_requests,
    too_many_sessions,
    too_many_threads,
    unavailable,
)
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.pool import RuntimePool
from talaria.proxy.sessions.conversation import EMPTY, Conversation, tools_fingerprint
from talaria.proxy.sessions.lineage import opening, parent_of
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.tenancy import (
    DEFAULT_MAX_PER_TENANT,
    DEFAULT_MAX_THREADS,
    SessionLimit,
    ThreadLimit,
)

SWEEP_S = 1.0
"""How often expired route preferences and idle sessions are looked for (clock seconds)."""
STORE_RETRY_S = 2.0
"""Retry-After of a call refused because the store cannot take its records: its write queue
is full, or (with durable acknowledgement) its writes are failing."""
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""A session with no call for this long ends (wall seconds). Agents' tool gaps are seconds
to minutes (docs/sources.md §2: p99 3.6 min); TraceLab's human waits between requests have a median
of 1.4 min, so an interactive session that pauses for longer starts a new session."""


class Gateway:
    """The proxy's call service (module docstring): ``open_call`` starts a call, and the
    lifecycle."""

    def __init__(
        self,
        pool: RuntimePool,
        keeper: SessionKeeper,
        recorder: Recorder,
        clock: Clock,
        time: TimeScale,
        *,
        router: str = "talaria",
        routing: RoutingConfig | None = None,
        routing_seed: int = 0,
        max_inflight_per_tenant: int = 512,
    ) -> None:
        self._pool = pool
        self._keeper = keeper
        self._recorder = recorder
        self._sessions = keeper.sessions
        self._preferences = keeper.preferences
        self._metrics = recorder.metrics
        self._clock = clock
        self._time = time
        self._router = router
        self._routing = routing or RoutingConfig()
        self._rng = random.Random(routing_seed)
        self._max_inflight = max_inflight_per_tenant
        self._closing = False
        self._schemas = SchemaCheck()
        self._runner = CallRunner(recorder, keeper, self._reroute, self._pool.settled)
        self._handoff: Handoff | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # -- the call path ------------------------------------------------------------------------
    async def open_call(self, call: PreparedCall) -> CallHandle:
        """Admit, place, resolve the session, route and run the call (module docstring);
        raises ApiError before anything runs."""
        ctx = await self._admit(call)
        await self._place(ctx)
        ctx = self._resolve(ctx)
        decision = await self._route(ctx)
        return self._run(ctx, decision.instance)

    async def _admit(self, call: PreparedCall) -> GatewayCall:
        """The call's context (proxy/callpath/stages.py): the call (its output limit fitted to
        the window: :func:`fit_window`), its prompt tokens and the status of the instances that
        may run it, or the ApiError that refuses it: a schema past its budget or a prompt past
        the context window (400), the shutdown or a store that cannot take its records (503),
        the tenant's calls in flight at their bound (429), no instance of its model (503)."""
        tools = tools_fingerprint(call.content.tools)
        messages = call.session_messages  # normalised (proxy/sessions/normalise.py)
        conversation = Conversation.of(messages) if messages is not None else EMPTY
        self._schemas.check(call.content, tools.digest, call.format_param)
        engine_gets_others = call.normalised is not None and not call.normalised.engine
        if call.content.messages is not None and not engine_gets_others:
            prompt_tokens = max(1, conversation.tokens[-1] + tools.tokens)  # the sums made
        else:
            prompt_tokens = call.content.prompt_tokens()
        call = fit_window(call, prompt_tokens, self._pool.context_window(call.model))
        if self._closing:
            raise unavailable(SHUTDOWN)
        if self._recorder.refusing:
            raise unavailable(
                "The session store cannot take this call's records now; retry shortly.",
                retry_after_s=STORE_RETRY_S,
            )
        if self._runner.inflight_of(call.tenant_id) >= self._max_inflight:
            raise too_many_requests(self._max_inflight)
        statuses = await self._pool.statuses(call.model)
        if not statuses:
            raise unavailable(f"No runtime instance hosting {call.model} is reachable right now.")
        now_s, now_at = self._clock.now(), datetime.now(UTC)
        return GatewayCall(call, tools, conversation, prompt_tokens, tuple(statuses), now_s, now_at)

    async def _place(self, ctx: GatewayCall) -> None:
        """With replicas, hold the session the call names if another replica held it (this
        one owns it now: the API layer forwards a call this replica does not own)."""
        if self._handoff is not None:
            await self._handoff.take_over(ctx.call, ctx.now_s)

    def _resolve(self, ctx: GatewayCall) -> GatewayCall:
        """The call's session (429 past the tenant's session cap; a child's parent: lineage.py),
        and the tokens of its prompt the session's KV already holds (None: unknown; the tools
        render ahead of the messages; only those before the first normalised message when the
        engine gets the client's own prompt: the volatile part may have changed)."""
        call, conversation, tools, now_s = ctx.call, ctx.conversation, ctx.tools, ctx.now_s
        try:
            found = resolve(
                self._sessions,
                tenant_id=call.tenant_id,
                identity=call.identity,
                model=call.model,
                conversation=conversation,
                now_s=now_s,
                now_at=ctx.now_at,
                match=call.content.messages is not None,
                offers_tools=bool(call.content.tools),
            )
        except SessionLimit as full:  # Retry-After: when its least recent one may idle out
            idle_in_s = full.oldest_activity_s + self._keeper.idle_timeout_s - now_s
            raise too_many_sessions(full.limit, self._time.wall(idle_in_s)) from full
        except ThreadLimit as busy:
            raise too_many_threads(busy.limit) from busy
        state = found.state
        if state.route_key is None:
            state.route_key = call.route_key
        shared: int | None = found.shared_tokens
        if call.normalised is not None and not call.normalised.engine:
            shared = min(found.shared_tokens, conversation.tokens[call.normalised.first])
        if found.how == "adopted":
            shared = None  # unknown here: the runtime's own record of the session decides
        elif shared and state.tools == tools.digest:
            shared += tools.tokens
        state.tools, state.opening = tools.digest, opening(call, conversation, tools, found.thread)
        parent = parent_of(self._sessions, state, call, conversation, tools)
        return replace(ctx, found=replace(found, parent=parent), shared_tokens=shared)

    async def _route(self, ctx: GatewayCall) -> RoutingDecision:
        """The instance that runs the call (503 if none can), among ``ctx.statuses``; the
        session's route preference is settled and the decision recorded."""
        call, found, now_s = ctx.call, ctx.resolution, ctx.now_s
        state = found.state
        last_instance = state.threads[found.thread].last_instance
        try:
            decision = route(
                self._router,
                RouteRequest(
                    session_key=state.runtime_key(found.thread),
                    model=call.model,
                    prompt_tokens=ctx.prompt_tokens,
                    last_instance=last_instance,
                    reserved_instance=self._preferences.reserved(  # routing's name for it
                        state.runtime_key(found.thread), now_s
                    ),
                    parent_key=found.parent.key,
                    parent_prefix_tokens=found.parent.prefix_tokens,
                ),
                self._pool.routable(
                    call.model, self._pool.with_own_calls(ctx.statuses), last_instance
                ),
                self._routing,
                self._rng,
            )
        except NoInstanceError as exc:
            raise unavailable(str(exc)) from exc
        # counted on its instance from now (the next call's routing sees it) to its end
        self._pool.dispatched(decision.instance, call.model)
        try:
            await self._keeper.routed(state, decision.instance, now_s, ctx.now_at, found.thread)
            self._recorder.decision(call, state, decision, found.how, ctx.now_at)
        except BaseException:
            self._pool.settled(decision.instance, call.model)
            raise
        return decision

    def _run(self, ctx: GatewayCall, instance: str) -> CallHandle:
        """Start the call on ``instance`` as its session's next call."""
        found = ctx.resolution
        state = found.state
        request = runtime_request(ctx, self._time)
        self._sessions.call_started(state, ctx.conversation, ctx.now_s, found.thread)
        # The instance knows the thread from now on, whether or not a call of it ever replies:
        # the thread's end (idle, final, retired) must reach it, or the node keeps the
        # session (and the KV an abandoned call left) for good.
        state.threads[found.thread].last_instance = instance
        self._metrics.live_sessions.set(len(self._sessions))
        run = RunningCall(ctx, request, self._pool[instance])
        task = self._runner.start(run)
        return CallHandle(
            run.events,
            task,
            lambda: run.runtime.name,
            state.session_id,
            state.key,
            found.how,
            abandon=lambda: self._runner.abandon(task),
            clock=run.clock,
        )

    async def _reroute(self, run: RunningCall, tried: frozenset[str]) -> RuntimeClient | None:
        """The call's instance could not be reached (nothing was sent): route it again, as
        ``_route`` does, among the instances hosting its model that answer, leaving out
        ``tried``; None if none is left or the proxy is closing (the call fails with 503)."""
        ctx = run.ctx
        answered = await self._pool.statuses(ctx.call.model)
        statuses = tuple(s for s in answered if s.instance not in tried)
        if not statuses or self._closing:
            return None
        now_s, now_at = self._clock.now(), datetime.now(UTC)
        try:
            decision = await self._route(
                replace(ctx, statuses=statuses, now_s=now_s, now_at=now_at)
            )
        except ApiError:
            return None
        found = ctx.resolution
        found.state.threads[found.thread].last_instance = decision.instance
        return self._pool[decision.instance]

    # -- replicas ---------------------------------------------------------------------------
    def use_replicas(self, owned: Owned, adopt: Adopt, generation: Generation) -> None:
        """Serve as one of several replicas (proxy/cluster/): ``owned(route_key)`` says
        whether this replica owns a session now (the sweep hands the others off), ``adopt
        (tenant, client id)`` finds an open session another replica held (taken over at its
        next call here), ``generation()`` counts the changes of the live set."""
        self._handoff = Handoff(
            self._sessions, self._preferences, self._time, owned, adopt, generation
        )
        self._keeper.served_elsewhere = self._handoff.served_elsewhere

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sweeper (expired route preferences, idle sessions, hand-offs)."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    @property
    def inflight(self) -> int:
        """Calls running now."""
        return self._runner.running

    async def _sweep(self) -> None:
        while True:
            await self._clock.sleep(SWEEP_S)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        """Release expired route preferences; end sessions idle beyond the timeout; hand off the
        sessions another replica owns now."""
        await self._keeper.sweep()
        if self._handoff is not None:
            self._handoff.hand_off()

    def refuse_new_calls(self) -> None:
        """From now on every new call gets 503 (the proxy is shutting down)."""
        self._closing = True

    def abort_calls(self) -> int:
        """Stop every running call: each client gets a 503 ("shutting down"), each call an
        error record (unless it had finished and only waited for its commit). Returns how many
        were running."""
        return self._runner.abort()

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new calls; let running ones finish for at most ``timeout_s`` (None: as
        long as they take), then abort the rest."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self._runner.close(timeout_s)


@dataclass(frozen=True)
class CallPath:
    """The call path's services, as the app's container starts them one by one
    (proxy/edge/services.py: ``pool``, ``recorder``, ``keeper``, ``gateway``)."""

    pool: RuntimePool
    recorder: Recorder
    keeper: SessionKeeper
    gateway: Gateway


def call_path(
    runtimes: Sequence[RuntimeClient],
    sink: RecordSink,
    metrics: ProxyMetrics,
    clock: Clock,
    *,
    router: str = "talaria",
    routing: RoutingConfig | None = None,
    routing_seed: int = 0,
    catalog_windows: Mapping[str, int] | None = None,
    max_inflight_per_tenant: int = 512,
    max_sessions_per_tenant: int = DEFAULT_MAX_PER_TENANT,
    max_threads_per_session: int = DEFAULT_MAX_THREADS,
    session_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    durable: bool = True,
    commit_timeout_s: float = 30.0,
    time_scale: float = 1.0,
) -> CallPath:
    """The call path over ``runtimes``, its records to ``sink``, in one go (a test's or a
    benchmark's, without the app); ``time_scale``: clock seconds per wall second. Not started
    (``gateway.start()`` starts its sweeper)."""
    time = TimeScale(time_scale)
    pool = RuntimePool(runtimes, time, catalog_windows)
    recorder = Recorder(
        sink, metrics, time, router=router, durable=durable, commit_timeout_s=commit_timeout_s
    )
    keeper = session_keeper(
        recorder,
        pool,
        clock,
        time,
        idle_timeout_s=session_idle_timeout_s,
        max_sessions_per_tenant=max_sessions_per_tenant,
        max_threads_per_session=max_threads_per_session,
    )
    gateway = Gateway(
        pool,
        keeper,
        recorder,
        clock,
        time,
        router=router,
        routing=routing,
        routing_seed=routing_seed,
        max_inflight_per_tenant=max_inflight_per_tenant,
    )
    return CallPath(pool, recorder, keeper, gateway)
