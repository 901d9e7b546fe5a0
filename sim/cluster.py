"""The replay's proxy: routes every call to a node with ``talaria.core.routing.route``.

For each call, in virtual time: read the session's live proxy-level soft reservation
(``core.preferences.SessionPreferences``, the gateway's own rules), take a ``status()``
snapshot of every node hosting the call's model, ``route`` with the policy's router and the
replay's seeded rng, release the reservation (the session is back; its gap is learned), and
submit to the chosen node. When the call ends, the book reserves the node for the session as
the gateway would after a reply that asks for tools: in a trace every call but a session's last
is followed by a tool gap, so "asks for tools" is "not final", and the expected gap is the
trace's hint (``expected_tool_gap_s``) when it has one, else the learned mean. After the last
call the book forgets the session, and every other node the session visited is told the
session ended (so it drops the session's stale KV), as the proxy would.

One node, or a model hosted by one node (``dedicated``): the only candidate, every time.

The candidates are those of the placement table (core/placement/table.py): fixed by the layout,
or changed by a placement driver (sim/placement_driver.py), which also hears of every call
(its demand) and is asked for a replica when a call's model has none (a cold start).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

from talaria.core.clock import Clock
from talaria.core.placement import PlacementTable
from talaria.core.preferences import SessionPreferences
from talaria.core.routing import RouteRequest, RoutingConfig, route
from talaria.core.routing.request import NoInstanceError
from talaria.core.routing.routers import get_router
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.scheduling.node import NodeScheduler


class Placer(Protocol):
    """What the dispatcher needs of a placement driver."""

    def observe(self, request: CallRequest) -> None:
        """A call arrived (its demand)."""

    async def ensure(self, model: str) -> None:
        """Return once some node serves ``model``."""

    def finished(self, result: CallResult) -> None:
        """A call finished (its duration)."""


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
        table: PlacementTable | None = None,
        placer: Placer | None = None,
    ) -> None:
        self.router = get_router(router).name
        self.config = config or RoutingConfig()
        self.book = SessionPreferences()
        self.reasons: Counter[str] = Counter()
        self.migrations = 0
        """Continuation calls routed to another node than the session's previous call."""
        self._clock = clock
        self._rng = random.Random(seed)
        self._nodes = {n.name: n for n in nodes}
        self.table = table or PlacementTable({n.name: n.engines for n in nodes})
        self._placer = placer
        self._last: dict[str, str] = {}
        self._model: dict[str, str] = {}
        self._visited: dict[str, set[str]] = {}

    async def call(self, request: CallRequest) -> CallResult:
        """Route ``request``, submit it, and keep the session's routing state."""
        sid = request.session_key
        last = self._last.get(sid)
        if self._placer is not None:
            self._placer.observe(request)
        names = self.table.candidates(request.model, last, self._clock.now())
        while not names:
            if self._placer is None:
                raise NoInstanceError(f"no node hosts model {request.model!r}")
            await self._placer.ensure(request.model)
            names = self.table.candidates(request.model, last, self._clock.now())
        now = self._clock.now()
        if len(names) == 1:  # what ``route`` decides for one candidate, without its status
            instance, reason = names[0], "only-candidate"
        else:
            reserved = self.book.reserved(sid, now)
            decision = route(
                self.router,
                RouteRequest(
                    sid,
                    request.model,
                    request.prompt_tokens,
                    last,
                    reserved,
                    request.parent_session_key,
                    request.parent_prefix_tokens,
                ),
                [self._nodes[name].status() for name in names],
                self.config,
                self._rng,
            )
            instance, reason = decision.instance, decision.reason
        self.reasons[reason] += 1
        self.book.started(sid, instance, now)
        if last is not None and last != instance:
            self.migrations += 1
            self._nodes[last].session_moved(sid)
        self._last[sid] = instance
        self._model[sid] = request.model
        self._visited.setdefault(sid, set()).add(instance)
        node = self._nodes[instance]
        result = await node.submit(request)
        if self._placer is not None:
            self._placer.finished(result)
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
            self._model.pop(sid, None)
        return result

    def live(self) -> Mapping[tuple[str, str], int]:
        """(node, model) → sessions not ended whose last call went to that node."""
        counts: dict[tuple[str, str], int] = {}
        for sid, node in self._last.items():
            key = (node, self._model[sid])
            counts[key] = counts.get(key, 0) + 1
        return counts
