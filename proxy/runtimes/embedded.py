"""The embedded runtime: simulated nodes in the proxy's own process (the default of
``talaria serve``), running the same scheduler as the simulator on a real or scaled clock.

The only module of the proxy that imports ``talaria.runtime``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.runtimes.base import RuntimeUnavailable
from talaria.runtime.engines.sim_reply import ReplyPolicy
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.sim_node import NodeSetup, build_sim_node


class InProcessRuntime:
    """A node in this process, running simulated engines on ``clock`` (real or scaled time).

    The simulated engines write the replies (runtime/engines/sim_reply.py); this client only
    passes calls and events through.
    ``status()`` is cached for ``status_ttl_s`` seconds of clock time.
    """

    kind = "in-process"
    address: str | None = None

    def __init__(self, node: NodeScheduler, clock: Clock, status_ttl_s: float = 0.05) -> None:
        self.name = node.name
        self._node = node
        self._clock = clock
        self._ttl_s = status_ttl_s
        self._status: InstanceStatus | None = None

    @property
    def node(self) -> NodeScheduler:
        """The node scheduler this client wraps."""
        return self._node

    @property
    def models(self) -> tuple[str, ...]:
        """The models the node hosts."""
        return tuple(self._node.engines)

    @property
    def context_windows(self) -> Mapping[str, int]:
        """Each engine's window (``EngineInfo.max_model_len``)."""
        return {name: e.info().max_model_len for name, e in self._node.engines.items()}

    @property
    def draining_models(self) -> frozenset[str]:
        """None: a proxy-side placement controller drives HTTP runtimes only."""
        return frozenset()

    async def start(self) -> None:
        """Start the node's scheduling loop."""
        self._node.start()

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """The node's event stream for the call (``NodeStopped`` once its loop has ended: the
        call is a 503)."""
        return self._node.stream(request)

    async def status(self) -> InstanceStatus:
        """The node's status, at most ``status_ttl_s`` clock seconds old; once the node's
        scheduling loop has ended (``NodeScheduler.failure``), ``RuntimeUnavailable`` with
        the reason, so that routing leaves it out (its models' calls are 503s) and ``/readyz``
        says so."""
        if self._node.failure is not None:
            raise RuntimeUnavailable(self._node.failure)
        now = self._clock.now()
        if self._status is None or now - self._status.at_s > self._ttl_s:
            self._status = self._node.status()
        return self._status

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        """Pass the tool-gap hint to the node."""
        self._node.hint(session_key, expected_gap_s)

    async def end_sessions(self, session_keys: Sequence[str]) -> None:
        """End the sessions on the node (it forgets them: NodeScheduler.end_session)."""
        for session_key in session_keys:
            self._node.end_session(session_key)

    async def resend_ends(self) -> None:
        """Nothing: an end in this process always arrives."""

    async def session_moved(self, session_key: str) -> None:
        """Release what the session holds on the node (its next call went elsewhere)."""
        self._node.session_moved(session_key)

    async def close(self) -> None:
        """Stop the node."""
        await self._node.stop()


def build_embedded(
    settings: ProxySettings, catalog: Catalog, clock: Clock
) -> list[InProcessRuntime]:
    """``settings.nodes`` simulated nodes (``node0``, ``node1``, ...) of the configured server,
    profile, models and policy, each behind an ``InProcessRuntime``."""
    flags = policy_flags(settings.policy)
    hint_cap_s = settings.max_hint_gap_s * settings.time_scale  # wall → the clock's seconds
    config = SchedulerConfig(quantum_s=settings.quantum_s, max_hint_gap_s=hint_cap_s)
    setup = NodeSetup(settings.server, settings.profile, tuple(settings.models))
    replies = ReplyPolicy(tool_calls_before_answer=settings.sim_tool_calls)
    return [
        InProcessRuntime(
            build_sim_node(f"node{i}", setup, catalog, flags, config, clock, replies),
            clock,
            settings.status_ttl_s,
        )
        for i in range(settings.nodes)
    ]
