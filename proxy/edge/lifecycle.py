"""The app's services, started and stopped in dependency order: a small service container in
the manner of composed Starlette lifespans.

Each service is declared with a name, what it needs (other services' names), how it starts
(given the parts started so far, it returns its own part) and how it stops (given its part).
``start`` runs them so that each starts after everything it needs, in the order declared among
those ready; ``stop`` stops the started ones in the reverse order. A service that fails to
start stops every service started before it, then the failure goes on: a proxy that cannot
start leaves nothing open (runtime clients' connections, the writer's task, a replica's
heartbeat).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger("talaria.proxy")
Part = TypeVar("Part")


class Parts:
    """The parts started so far, by service name."""

    def __init__(self) -> None:
        self._parts: dict[str, Any] = {}

    def get(self, name: str, kind: type[Part]) -> Part:
        """The part of service ``name``, which must be a ``kind``."""
        part = self._parts[name]
        if not isinstance(part, kind):
            raise TypeError(f"service {name!r} is a {type(part).__name__}, not a {kind.__name__}")
        return part

    def optional(self, name: str, kind: type[Part]) -> Part | None:
        """The part of service ``name`` (a ``kind``), or None if it has none."""
        return None if self._parts.get(name) is None else self.get(name, kind)

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def put(self, name: str, part: Any) -> None:
        """Keep ``part`` as service ``name``'s."""
        self._parts[name] = part


Start = Callable[[Parts], Awaitable[Any]]
Stop = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True)
class Service:
    """One service: how it starts and stops, and the services it needs."""

    name: str
    start: Start
    stop: Stop | None = None
    needs: tuple[str, ...] = ()


class Lifecycle:
    """The declared services (module docstring)."""

    def __init__(self) -> None:
        self._declared: list[Service] = []
        self._started: list[Service] = []
        self.parts = Parts()

    def add(
        self, name: str, start: Start, stop: Stop | None = None, *, needs: tuple[str, ...] = ()
    ) -> None:
        """Declare a service; ``needs`` must name services declared before or after it."""
        if any(s.name == name for s in self._declared):
            raise ValueError(f"service {name!r} declared twice")
        self._declared.append(Service(name, start, stop, needs))

    def order(self) -> list[Service]:
        """The declared services in start order: each after what it needs, the declared
        order among those ready; ``ValueError`` for a need never declared or a cycle."""
        names = {s.name for s in self._declared}
        for service in self._declared:
            missing = set(service.needs) - names
            if missing:
                raise ValueError(f"service {service.name!r} needs undeclared {sorted(missing)}")
        ordered: list[Service] = []
        done: set[str] = set()
        left = list(self._declared)
        while left:
            ready = next((s for s in left if set(s.needs) <= done), None)
            if ready is None:
                raise ValueError(f"services that need each other: {[s.name for s in left]}")
            ordered.append(ready)
            done.add(ready.name)
            left.remove(ready)
        return ordered

    async def start(self) -> Parts:
        """Start every service in :meth:`order`; on a failure, stop the started ones."""
        for service in self.order():
            try:
                self.parts.put(service.name, await service.start(self.parts))
            except BaseException:
                log.error("service %s failed to start; stopping the %d started before it",
                          service.name, len(self._started))  # fmt: skip
                await self.stop()
                raise
            self._started.append(service)
        return self.parts

    async def stop(self) -> None:
        """Stop the started services, the last started first; a stop that fails is logged and
        the others still stop."""
        while self._started:
            service = self._started.pop()
            if service.stop is None:
                continue
            try:
                await service.stop(self.parts.get(service.name, object))
            except Exception:
                log.exception("service %s failed to stop", service.name)
