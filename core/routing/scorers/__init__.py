"""The scorer registry: scorer name → ``Scorer`` (base.py), one line per scorer file.

Registry order is the fixed order of reports and of reason ties (picker.py). Which scorers a
router uses, and with what weight, is configuration (``RoutingConfig``, settings.py), not a
property of the scorer.
"""

from __future__ import annotations

from talaria.core.routing.scorers import (
    instance_pressure,
    kv_locality,
    model_affinity,
    model_residency,
    parent_kv,
)
from talaria.core.routing.scorers.base import Scorer

SCORERS: dict[str, Scorer] = {
    "model_residency": model_residency.SCORER,
    "kv_locality": kv_locality.SCORER,
    "parent_kv": parent_kv.SCORER,
    "instance_pressure": instance_pressure.SCORER,
    "model_affinity": model_affinity.SCORER,
}


def get_scorer(name: str) -> Scorer:
    """The registered scorer ``name``; ``ValueError`` naming the registered ones otherwise."""
    try:
        return SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; registered: {', '.join(SCORERS)}") from None
