"""The runtime pool: the runtime instances the proxy routes to, the models they host, their
statuses, the drains an operator set (a drained instance gets no new call), and the models a
placement controller drains (a draining model gets no new session on that instance)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from talaria.core.clock import TimeScale
from talaria.core.status import InstanceStatus
from talaria.proxy.runtimes.base import RuntimeClient

log = logging.getLogger("talaria.proxy.callpath.gateway")  # the gateway's part: its log name


class RuntimePool:
    """The runtime clients by name; ``catalog_windows``: model → the catalog's context window
    (tokens), for a model no instance reports a window for."""

    def __init__(
        self,
        runtimes: Sequence[RuntimeClient],
        time: TimeScale,
        catalog_windows: Mapping[str, int] | None = None,
    ) -> None:
        self.runtimes = list(runtimes)
        self._by_name = {r.name: r for r in self.runtimes}
        self._time = time
        self._catalog_windows = catalog_windows or {}
        self._drained: frozenset[str] = frozenset()
        self._failures: dict[str, str] = {}
        self._dispatched: dict[tuple[str, str], int] = {}
        """(instance, model) → calls routed there that have not ended."""

    def __getitem__(self, name: str) -> RuntimeClient:
        """The runtime instance called ``name``."""
        return self._by_name[name]

    # -- catalog ------------------------------------------------------------------------------
    def models(self) -> list[str]:
        """Every model some instance hosts, sorted."""
        return sorted({m for r in self.runtimes for m in r.models})

    def context_window(self, model: str) -> int | None:
        """The model's context window in tokens: the smallest any instance reports now (its
        engine's ``max_model_len``; a model placed while the proxy runs reports it from its
        runtime's next status read), else the catalog's, else None (not checked)."""
        reported = [
            window
            for runtime in self.runtimes
            if (window := runtime.context_windows.get(model)) is not None
        ]
        return min(reported) if reported else self._catalog_windows.get(model)

    async def residency(self) -> dict[str, list[dict[str, Any]]]:
        """model → [{instance, state, next_slot_in_s}] (for /v1/models; wall seconds): the
        models each instance takes calls of (a model it is retiring is left out)."""
        statuses = await self.statuses(None)
        out: dict[str, list[dict[str, Any]]] = {m: [] for m in self.models()}
        serving = {r.name: set(r.models) for r in self.runtimes}
        for status in statuses:
            for name, res in status.models.items():
                if name not in serving.get(status.instance, {name}):
                    continue  # leaving it: its runtime no longer takes its calls
                out.setdefault(name, []).append(
                    {
                        "instance": status.instance,
                        "state": res.state.value,
                        "next_slot_in_s": round(self._time.wall(res.next_slot_in_s), 3),
                    }
                )
        return out

    def get(self, name: str) -> RuntimeClient | None:
        """The runtime instance called ``name``, if the pool has it."""
        return self._by_name.get(name)

    async def resend_ends(self) -> None:
        """Every instance sends again the session ends it has not delivered (all at once)."""
        await asyncio.gather(*(runtime.resend_ends() for runtime in self.runtimes))

    # -- statuses and drains ------------------------------------------------------------------
    async def reachable(self) -> list[str]:
        """The instances whose status answers now."""
        return [status.instance for status in await self.statuses(None)]

    @property
    def failures(self) -> dict[str, str]:
        """Instance → why its last status read failed (those that answered since are not
        listed): for ``/readyz``."""
        return dict(self._failures)

    @property
    def drained(self) -> frozenset[str]:
        """Runtime instances being drained: no new call is routed to them."""
        return self._drained

    def set_drained(self, names: set[str]) -> None:
        """Drain exactly ``names`` from now on (the others serve again)."""
        self._drained = frozenset(names)

    # -- this proxy's own calls ---------------------------------------------------------------
    def dispatched(self, instance: str, model: str) -> None:
        """A call of ``model`` was routed to ``instance``: it counts there until
        :meth:`settled`."""
        key = (instance, model)
        self._dispatched[key] = self._dispatched.get(key, 0) + 1

    def settled(self, instance: str, model: str) -> None:
        """A call of ``model`` routed to ``instance`` ended (or went elsewhere)."""
        key = (instance, model)
        left = self._dispatched.get(key, 0) - 1
        if left > 0:
            self._dispatched[key] = left
        else:
            self._dispatched.pop(key, None)

    def with_own_calls(self, statuses: Sequence[InstanceStatus]) -> list[InstanceStatus]:
        """``statuses`` with the calls this proxy routed and has not seen end counted as a
        fresh status would count them. A status is read before the call is routed (at its
        admission, or cached for ``status_ttl_s``), so it counts none of the calls routed
        since: new sessions arriving together would all see the same idle instances, tie, and
        pile onto one of them (7 of 8 on one of two replicas, measured: docs/results.md §15).

        The calls the status does not show, ``unseen = max(0, own calls − running_calls)``,
        are added as the instance will report them once admitted: each a running call and a
        live session of its model (``instance_pressure`` counts both; a status read after the
        calls already does). Counting them as running calls alone made a status read before
        them look lighter than a fresh one of the same instance. Per model, at most its own
        calls there are added as live sessions (a continuing session's call adds one it
        already counts: 1 / ``pressure_ref_sessions``, against ``kv_locality``'s 1)."""
        if not self._dispatched:
            return list(statuses)
        mine: dict[str, dict[str, int]] = {}
        for (instance, model), count in self._dispatched.items():
            mine.setdefault(instance, {})[model] = count
        out = []
        for s in statuses:
            own = mine.get(s.instance, {})
            unseen = sum(own.values()) - s.running_calls
            if unseen <= 0:
                out.append(s)
                continue
            models = dict(s.models)
            left = unseen
            for model, count in sorted(own.items()):
                if left <= 0:
                    break
                add = min(count, left)
                left -= add
                if model in models:
                    residency = models[model]
                    models[model] = replace(residency, live_sessions=residency.live_sessions + add)
            out.append(replace(s, running_calls=s.running_calls + unseen, models=models))
        return out

    def routable(
        self, model: str, statuses: list[InstanceStatus], last_instance: str | None
    ) -> list[InstanceStatus]:
        """Of ``statuses`` (instances hosting ``model``), those that take a call of a session
        whose last call ran on ``last_instance``: an instance draining the model takes only
        its own sessions' calls (they keep their KV there until the controller removes the
        model), unless no other instance serves it (then every one does)."""
        draining = {r.name for r in self.runtimes if model in r.draining_models}
        if not draining or all(s.instance in draining for s in statuses):
            return statuses
        return [s for s in statuses if s.instance not in draining or s.instance == last_instance]

    async def statuses(self, model: str | None) -> list[InstanceStatus]:
        """Status of every instance hosting ``model`` (all if None) that answers, asked of all
        at once; an instance that fails is left out of this decision (and logged), not fatal.
        For a call (a ``model``), drained instances are left out too."""
        asked = [
            runtime
            for runtime in self.runtimes
            if model is None or (model in runtime.models and runtime.name not in self._drained)
        ]
        if len(asked) == 1:  # the common case: no gather (a task per runtime) to pay for
            answers: list[InstanceStatus | BaseException] = []
            try:
                answers.append(await asked[0].status())
            except Exception as exc:
                answers.append(exc)
        else:
            answers = await asyncio.gather(*(r.status() for r in asked), return_exceptions=True)
        statuses = []
        for runtime, answer in zip(asked, answers, strict=True):
            if isinstance(answer, InstanceStatus):
                statuses.append(answer)
                self._failures.pop(runtime.name, None)
            elif isinstance(answer, Exception):
                log.warning("runtime %s: status failed: %r", runtime.name, answer)
                self._failures[runtime.name] = str(answer)
            else:
                raise answer  # cancellation and the like are not a runtime's failure
        return statuses
