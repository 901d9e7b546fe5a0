"""The replay's proxy: routes every call to a node with ``talaria.core.routing.route``.

For each call, in virtual time: read the session's live proxy-level soft reservation
(``core.reservations.SessionReservations``, the gateway's own rules), take a ``status()``
snapshot of every node hosting the call's model, ``route`` with the policy's router and the
replay's seeded rng, release the reservation (the session is back; its gap is learned), and
submit to the chosen node. When the call ends, the book reserves the node for the session as
the gateway would after a reply that asks for tools: in a trace every call but a session's last
is followed by a tool gap, so "asks for tools" is "not final", and the expected gap is the
trace's hint (``expected_tool_gap_s``) when it has one, else the learned mean. After the last
call the book forgets the session, and every other node the session visited is told the
session ended (so it drops the session's stale KV), as the proxy would.

One node, or a model hosted by one node (``dedicated``): the only candidate, every time.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from talaria.core.clock import Clock
from talaria.core.reservations import SessionReservations
from talaria.core.routing import RouteRequest, RoutingConfig, route
from talaria.core.routing.request import NoInstanceError
from talaria.core.routing.routers import get_router
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.scheduling.node import NodeScheduler


class Dispatcher:
    """The replay's proxy over ``nodes``: routes each call with ``router`` and the seeded rng,
    and keeps the sessions' soft reservations and last nodes (module docstring)."""

    def __init__(
        self,
        nodes: Sequence[NodeScheduler],
        router: str,
        clock: Clock,
        config: RoutingConfig | None = None,
        seed: int = 0,
    ) -> None:
        self.router = get_router(router).name
        self.config = config or RoutingConfig()
        self.book = SessionReservations()
        self.reasons: Counter[str] = Counter()
        self.migrations = 0
        """Continuation calls routed to another node than the session's previous call."""
        self._clock = clock
        self._rng = random.Random(seed)
        self._nodes = {n.name: n for n in nodes}
        self._hosting: dict[str, list[NodeScheduler]] = {}
        for node in nodes:
            for model in node.engines:
                self._hosting.setdefault(model, []).append(node)
        self._last: dict[str, str] = {}
        self._visited: dict[str, set[str]] = {}

    async def call(self, request: CallRequest) -> CallResult:
        """Route ``request``, submit it, and keep the session's routing state."""
        sid = request.session_key
        candidates = self._hosting.get(request.model)
        if not candidates:
            raise NoInstanceError(f"no node hosts model {request.model!r}")
        now = self._clock.now()
        reserved = self.book.reserved(sid, now)
        last = self._last.get(sid)
        decision = route(
            self.router,
            RouteRequest(sid, request.model, request.prompt_tokens, last, reserved),
            [node.status() for node in candidates],
            self.config,
            self._rng,
        )
        self.reasons[decision.reason] += 1
        self.book.started(sid, decision.instance, now)
        if last is not None and last != decision.instance:
            self.migrations += 1
            self._nodes[last].session_moved(sid)
        self._last[sid] = decision.instance
        self._visited.setdefault(sid, set()).add(decision.instance)
        node = self._nodes[decision.instance]
        result = await node.submit(request)
        final = request.session_final
        self.book.finished(
            sid,
            node.name,
            result.finished_s,
            final=final,
            asks_tools=not final,
            hint_s=request.expected_tool_gap_s,
        )
        if final:
            for other in sorted(self._visited.pop(sid, set()) - {node.name}):
                self._nodes[other].end_session(sid)
            self._last.pop(sid, None)
        return result
