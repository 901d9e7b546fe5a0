"""What the node does around a switch of models, and whether a continuation may enter a
contended slot (policies/__init__.py lists the kinds).

- ``SwitchPolicy``: at a switch, the outgoing model's session KV moves to host DRAM or is
  dropped (``keeps_kv_on_host``); during a slot, the first incoming model's weights are staged
  into free HBM, so the switch is a device copy (``stages_weights``; the outgoing model keeps
  its pinned host weight copy for that).
- ``AdmissionRule``: in a contended slot a call waits for the next slot, unless the rule admits
  session-prefill: a continuation whose estimated service fits the time left
  (admission.py ``decide_admission``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from talaria.runtime.scheduling.admission import AdmissionDecision, decide_admission
from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.events import SessionEvents


@dataclass(frozen=True)
class SwitchPolicy(SessionEvents):
    """What a switch keeps (the module docstring)."""

    keeps_kv_on_host: bool
    stages_weights: bool

    async def deactivate(self, engine: DrivenEngine) -> None:
        """Switch ``engine``'s model out."""
        await engine.deactivate(
            keep_kv_on_host=self.keeps_kv_on_host, keep_host_weight_copy=self.stages_weights
        )

    def stage(self, engines: Mapping[str, DrivenEngine], incoming: list[str]) -> None:
        """During a slot: stage the first incoming model's weights, and no other's."""
        if not self.stages_weights or not incoming:
            return
        target = incoming[0]
        for name, engine in engines.items():
            if name != target and not engine.active:
                engine.cancel_staging()
        engines[target].start_staging()


@dataclass(frozen=True)
class AdmissionRule(SessionEvents):
    """Whether a waiting call enters now (the module docstring)."""

    session_prefill: bool
    instances: bool = False
    """Request-level instances: every call of a resident model enters (admission.py)."""

    def decide(
        self,
        *,
        closing: bool,
        in_slot_batch: bool,
        contended: bool,
        is_continuation: bool,
        remaining_s: float,
        estimate_service_s: Callable[[], float],
    ) -> AdmissionDecision:
        """admission.py ``decide_admission`` under this rule."""
        return decide_admission(
            sp_admission=self.session_prefill,
            closing=closing,
            in_slot_batch=in_slot_batch,
            contended=contended,
            is_continuation=is_continuation,
            remaining_s=remaining_s,
            estimate_service_s=estimate_service_s,
            instances=self.instances,
        )
