"""The ``RuntimeClient`` seam: how the gateway reaches a runtime instance.

``InProcessRuntime`` wraps a ``NodeScheduler`` living in the proxy's own event loop (the
embedded default). An HTTP client for remote runtime servers comes with the runtime server.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from talaria.core.clock import Clock
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, GenerationEvent
from talaria.runtime.scheduling.node import NodeScheduler


class RuntimeClient(Protocol):
    name: str
    kind: str
    address: str | None
    """Where the runtime is reached (a URL), or None for one in this process."""

    @property
    def models(self) -> tuple[str, ...]: ...

    async def start(self) -> None: ...

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]: ...

    async def status(self) -> InstanceStatus: ...

    async def hint(self, session_id: str, expected_gap_s: float) -> None: ...

    async def end_session(self, session_id: str) -> None: ...

    async def session_moved(self, session_id: str) -> None:
        """The session's next call went to another instance: release what it holds here."""
        ...

    async def close(self) -> None: ...


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
        return self._node

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._node.engines)

    async def start(self) -> None:
        self._node.start()

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._node.stream(request)

    async def status(self) -> InstanceStatus:
        now = self._clock.now()
        if self._status is None or now - self._status.at_s > self._ttl_s:
            self._status = self._node.status()
        return self._status

    async def hint(self, session_id: str, expected_gap_s: float) -> None:
        self._node.hint(session_id, expected_gap_s)

    async def end_session(self, session_id: str) -> None:
        self._node.end_session(session_id)

    async def session_moved(self, session_id: str) -> None:
        self._node.session_moved(session_id)

    async def close(self) -> None:
        await self._node.stop()
