"""The node's view of an engine: the required executor (runtime/engine.py ``Engine``) with every
optional capability, each the engine's own where it implements it, else the default here that
says what its absence means. The node takes its engines through ``DrivenEngines``
(``NodeContext.engines``), so the slot loop, the intake, the holds and the status read one
whole interface, and an engine implements only what it does.

- ``Switching``, else ``Gate``: the node opens and closes the engine as the slot decides, at
  no cost; it holds nothing that co-residency must fit;
- ``Staging``, else ``NotStaged``: nothing is staged, ever;
- ``MemoryAccounting``, else ``SelfManaged``: the engine's memory is its own; no call or switch
  waits for memory on its behalf;
- ``KvTiming``, else ``Untimed``: its sessions' KV counts for routing only while in HBM;
- ``OwnKv``, else ``NoOwnKv``: it holds no KV outside ``NodeMemory``;
- ``Health``, else ``AlwaysHealthy``: it can always serve.

Each capability is detected once, when the view is made (``isinstance`` on the
``runtime_checkable`` protocols).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping

from talaria.core.types import CallRequest, GenerationEvent, KvSource
from talaria.runtime.engine import (
    Admission,
    Engine,
    EngineInfo,
    Health,
    KvTiming,
    MemoryAccounting,
    OwnKv,
    Staging,
    Switching,
)


class Gate:
    """``Switching`` for an engine without it: the model is in or out as the node's slot
    decides (its calls are admitted only while in), switched in no time, holding nothing
    that co-residency must fit beside the other models."""

    weight_bytes = 0.0

    def __init__(self) -> None:
        self.active = False

    def switch_in_s(self) -> float:
        """No time: nothing moves."""
        return 0.0

    async def activate(self) -> float:
        """Open the gate."""
        self.active = True
        return 0.0

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Close the gate (its KV, if any, is the engine's business)."""
        self.active = False
        return 0.0


class NotStaged:
    """``Staging`` for an engine without it: nothing is ever staged."""

    staging = False
    staged_fraction = 0.0

    def start_staging(self) -> bool:
        """Nothing to stage."""
        return False

    def cancel_staging(self) -> None:
        """Nothing staged."""


class SelfManaged:
    """``MemoryAccounting`` for an engine without it: its memory is its own (or it has none),
    so the node's byte accounting sees none of it."""

    def kv_bytes(self, tokens: int) -> float:
        """None of the node's bytes."""
        return 0.0

    def kv_floor_bytes(self) -> float:
        """No room to keep beside its weights."""
        return 0.0

    def needed_bytes(self, request: CallRequest) -> float:
        """No bytes of the node's: the call never waits for memory here."""
        return 0.0

    def can_activate(self) -> bool:
        """Its room is its own: a switch never waits for memory here."""
        return True


class Untimed:
    """``KvTiming`` for an engine without it: no saving is claimed for KV outside HBM (routing
    reads a restore and a recompute of 0 s as no saving)."""

    def kv_restore_s(self, tokens: int) -> float:
        """Unknown: 0."""
        return 0.0

    def recompute_s(self, tokens: int) -> float:
        """Unknown: 0."""
        return 0.0


class NoOwnKv:
    """``OwnKv`` for an engine without it: whatever KV it has is in ``NodeMemory`` (read there)."""

    def session_kv(self) -> Mapping[str, tuple[int, KvSource]]:
        """Nothing outside ``NodeMemory``."""
        return {}


class AlwaysHealthy:
    """``Health`` for an engine without it: it can always serve."""

    def fault(self) -> str | None:
        """None: no fault."""
        return None


NOT_STAGED = NotStaged()
SELF_MANAGED = SelfManaged()
UNTIMED = Untimed()
NO_OWN_KV = NoOwnKv()
ALWAYS_HEALTHY = AlwaysHealthy()


class DrivenEngine:
    """One engine as the node drives it: ``Engine``'s members, each the engine's, and every
    capability's, each from the engine where it implements the capability, else from its
    default (the module docstring's table). ``engine``: the engine itself."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.model = engine.model
        self._switching: Switching = engine if isinstance(engine, Switching) else Gate()
        self._staging: Staging = engine if isinstance(engine, Staging) else NOT_STAGED
        self._memory: MemoryAccounting = (
            engine if isinstance(engine, MemoryAccounting) else SELF_MANAGED
        )
        self._timing: KvTiming = engine if isinstance(engine, KvTiming) else UNTIMED
        self._own: OwnKv = engine if isinstance(engine, OwnKv) else NO_OWN_KV
        self._health: Health = engine if isinstance(engine, Health) else ALWAYS_HEALTHY

    # -- Engine ------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """``Engine.running``."""
        return self.engine.running

    @property
    def busy_s(self) -> float:
        """``Engine.busy_s``."""
        return self.engine.busy_s

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """``Engine.estimate_service_s``."""
        return self.engine.estimate_service_s(request, expected_output_tokens)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """``Engine.decode_step_s``."""
        return self.engine.decode_step_s(batch, context_tokens)

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """``Engine.try_admit``."""
        return self.engine.try_admit(request, arrival_s, sp_admitted)

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """``Engine.run``."""
        return self.engine.run(admission)

    def info(self) -> EngineInfo:
        """``Engine.info``."""
        return self.engine.info()

    # -- Switching ---------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """``Switching.active``."""
        return self._switching.active

    @property
    def weight_bytes(self) -> float:
        """``Switching.weight_bytes``."""
        return self._switching.weight_bytes

    def switch_in_s(self) -> float:
        """``Switching.switch_in_s``."""
        return self._switching.switch_in_s()

    async def activate(self) -> float:
        """``Switching.activate``."""
        return await self._switching.activate()

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """``Switching.deactivate``."""
        return await self._switching.deactivate(keep_kv_on_host, keep_host_weight_copy)

    # -- Staging -----------------------------------------------------------------------------
    @property
    def staging(self) -> bool:
        """``Staging.staging``."""
        return self._staging.staging

    @property
    def staged_fraction(self) -> float:
        """``Staging.staged_fraction``."""
        return self._staging.staged_fraction

    def start_staging(self) -> bool:
        """``Staging.start_staging``."""
        return self._staging.start_staging()

    def cancel_staging(self) -> None:
        """``Staging.cancel_staging``."""
        self._staging.cancel_staging()

    # -- MemoryAccounting, KvTiming, OwnKv ---------------------------------------------------
    def kv_bytes(self, tokens: int) -> float:
        """``MemoryAccounting.kv_bytes``."""
        return self._memory.kv_bytes(tokens)

    def kv_floor_bytes(self) -> float:
        """``MemoryAccounting.kv_floor_bytes``."""
        return self._memory.kv_floor_bytes()

    def needed_bytes(self, request: CallRequest) -> float:
        """``MemoryAccounting.needed_bytes``."""
        return self._memory.needed_bytes(request)

    def can_activate(self) -> bool:
        """``MemoryAccounting.can_activate``."""
        return self._memory.can_activate()

    def kv_restore_s(self, tokens: int) -> float:
        """``KvTiming.kv_restore_s``."""
        return self._timing.kv_restore_s(tokens)

    def recompute_s(self, tokens: int) -> float:
        """``KvTiming.recompute_s``."""
        return self._timing.recompute_s(tokens)

    def session_kv(self) -> Mapping[str, tuple[int, KvSource]]:
        """``OwnKv.session_kv``."""
        return self._own.session_kv()

    def fault(self) -> str | None:
        """``Health.fault``."""
        return self._health.fault()


class DrivenEngines(Mapping[str, DrivenEngine]):
    """The node's model set as its scheduler reads it: a read-only view of ``engines`` (which
    the node alone changes: ``add_model``, ``retire``), in their order, each engine seen
    through its ``DrivenEngine``, made once per engine."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self._engines = engines
        self._views: dict[str, DrivenEngine] = {}

    def __getitem__(self, model: str) -> DrivenEngine:
        engine = self._engines[model]
        view = self._views.get(model)
        if view is None or view.engine is not engine:  # new, or placed again
            view = self._views[model] = DrivenEngine(engine)
            for gone in [m for m in self._views if m not in self._engines]:
                del self._views[gone]  # retired since
        return view

    def __contains__(self, model: object) -> bool:
        return model in self._engines

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)
