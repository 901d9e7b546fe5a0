"""The ``RuntimeClient`` seam: how the gateway reaches a runtime instance.

Its implementations are siblings in this package: ``http.HttpRuntime`` (a runtime server,
runtime/server.py, over HTTP) and ``embedded.InProcessRuntime`` (a node in the proxy's own
event loop, the default of ``talaria serve``). This module imports only ``talaria.core``; of
the proxy, only ``embedded.py`` imports ``talaria.runtime``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Protocol

from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, GenerationEvent


class RuntimeUnavailable(RuntimeError):
    """The runtime could not be reached or refused the call (the gateway answers 503)."""


class RuntimeUnreachable(RuntimeUnavailable):
    """The call never reached the runtime: no connection to it could be made, so nothing of
    the call was sent or ran there, and it may run on another instance (the runner routes it
    again: proxy/callpath/runner.py)."""


class RuntimeClient(Protocol):
    """One runtime instance as the gateway sees it: its models, a stream of events per call,
    its status for routing, and best-effort session hints."""

    name: str
    """The instance's name (what routing decisions and records name)."""
    kind: str
    """Which client this is (``http``, ``in-process``, ``instant``)."""
    address: str | None
    """Where the runtime is reached (a URL), or None for one in this process."""

    @property
    def models(self) -> tuple[str, ...]:
        """The models the instance hosts (known after ``start``)."""
        ...

    @property
    def context_windows(self) -> Mapping[str, int]:
        """Each hosted model's context window as the instance reports it (its engine's
        longest prompt + output; known after ``start``; a model it does not report is left
        to the catalog)."""
        ...

    @property
    def draining_models(self) -> frozenset[str]:
        """Hosted models a placement controller is draining here: no new session is routed
        to them while another instance serves them (runtime/placement_routes.py)."""
        ...

    async def start(self) -> None:
        """Connect (or start the in-process node) and learn the instance's name and models."""
        ...

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Run the call: ``FirstToken``, ``TokenDelta``s for a streaming call, ``Finished``."""
        ...

    async def status(self) -> InstanceStatus:
        """The instance's status for routing (may be cached for a short while)."""
        ...

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        """The session's next call is expected in ``expected_gap_s`` seconds (best effort)."""
        ...

    async def end_sessions(self, session_keys: Sequence[str]) -> None:
        """These sessions (or threads: their runtime keys) ended: forget everything the
        instance keeps of them. Never raises; an end the instance does not take is kept and
        sent again at ``resend_ends``."""
        ...

    async def resend_ends(self) -> None:
        """Send again the ends the instance has not taken (the keeper's sweep calls it)."""
        ...

    async def session_moved(self, session_key: str) -> None:
        """The session's next call went to another instance: release what it holds here."""
        ...

    async def close(self) -> None:
        """Release the client's connections (or stop the in-process node)."""
        ...
