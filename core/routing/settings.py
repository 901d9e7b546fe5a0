"""Routing settings: each router's scorers and their weights, and the scorers' reference scales.

The simulator and the proxy use the defaults below. A router scores with exactly the scorers
its weight table names (core/routing/scorers/ registers them by name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class ScorerWeights(dict[str, float]):
    """A router's weight per scorer name in its total ``Σ weight × score``: the scorers it
    names are the ones the router scores and reports (weight 0: reported, not counted).
    Built like a dict (``ScorerWeights(kv_locality=1.0)``); every weight must be ≥ 0."""

    def __init__(
        self, weights: Mapping[str, float] | Iterable[tuple[str, float]] = (), /, **named: float
    ) -> None:
        super().__init__(weights, **named)
        for name, value in self.items():
            if not value >= 0.0:  # also rejects NaN
                raise ValueError(f"weight {name} must be >= 0, got {value}")


@dataclass(frozen=True)
class RoutingConfig:
    """The scorers' reference scales and, per router, its weight table (``weights``)."""

    residency_tau_s: float = 10.0
    """Time scale of ``model_residency`` (score 1/2 when the model serves in tau seconds): about
    one sleep + wake switch of the paper's models at the measured sleep-mode rates (8.6–10.7 s),
    so a model one plain switch away scores ≈ 0.5 and one 60 s quantum away ≈ 0.14."""
    pressure_ref_tokens: float = 8192.0
    """Waiting prompt tokens that count as one unit of load: one prefill step's token budget
    (``max_num_batched_tokens`` of the default profile), i.e. one step of queued prefill."""
    pressure_ref_calls: float = 32.0
    """Running calls that count as one unit of load: the paper's whole workload (30 sessions,
    at most one call each in flight) running on one node at once."""
    pressure_ref_sessions: float = 32.0
    """Live sessions (running, queued or in a tool gap) that count as one unit of load: the
    paper's whole workload (30 sessions) living on one node, as for ``pressure_ref_calls``."""
    pressure_ref_bytes: float = 100e9
    """Bytes of other sessions' soft reservations that count as one unit of load: ~100 GB is
    the KV room left on an 8×H200 node (1,015 GB usable) once a 355–690 GB model and a staged
    successor are resident, so reservations weigh at least as much as KV already in use."""
    talaria: ScorerWeights = field(
        default_factory=lambda: ScorerWeights(
            model_residency=1.0,
            kv_locality=1.0,
            parent_kv=1.0,
            instance_pressure=0.5,
            model_affinity=0.5,
        )
    )
    """Residency and KV locality each save seconds per call (a switch, or a prefix recompute
    or restore), so they weigh 1. Pressure weighs 0.5: its whole range (0.5) is below a KV hit
    in HBM (1), so load alone never moves a session off its KV in HBM, but it outweighs a
    residency gap smaller than 0.5 × (1 − pressure of the busy node). E.g. GLM-4.5 asleep on an
    idle node (4.2 s wake → residency 0.71) wins over GLM-4.5 active on a node whose load
    exceeds ~1.4 units (pressure < 0.41): cold sessions spread once the warm node is busy.
    Affinity weighs 0.5 for the same reason as pressure: its whole range stays below a KV hit
    in HBM, so it places new sessions (and sessions whose KV is gone) without moving a
    session off its KV. A sub-agent's parent's KV (``parent_kv``) weighs 1 like the session's
    own, in the same unit (the fraction of the call's prefill saved), so a child goes where its
    parent's prefix is unless load outweighs the share it saves: a child whose shared prefix
    is 40 % of its prompt (0.4) moves to an idle node when the parent's has 0.8 units more
    pressure."""
    load_only: ScorerWeights = field(default_factory=lambda: ScorerWeights(instance_pressure=1.0))
    """Least outstanding work only."""
    sticky: ScorerWeights = field(default_factory=lambda: ScorerWeights(instance_pressure=1.0))
    """Where the sticky rule does not decide: least outstanding work."""
    kv_aware: ScorerWeights = field(
        default_factory=lambda: ScorerWeights(kv_locality=1.0, instance_pressure=0.5)
    )
    """KV locality and load, no model residency."""

    def __post_init__(self) -> None:
        for name in (
            "residency_tau_s",
            "pressure_ref_tokens",
            "pressure_ref_calls",
            "pressure_ref_sessions",
            "pressure_ref_bytes",
        ):
            value = getattr(self, name)
            if not value > 0.0:
                raise ValueError(f"{name} must be > 0, got {value}")

    def weights(self, router: str) -> ScorerWeights:
        """The weights of router ``router`` (``talaria``, ``load-only``, ``sticky``,
        ``kv-aware``)."""
        attr = router.replace("-", "_")
        value = getattr(self, attr, None)
        if not isinstance(value, ScorerWeights):
            raise ValueError(f"no weights for router {router!r}")
        return value
