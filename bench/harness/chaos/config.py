"""The chaos scenario's sizes and times, and the names its processes share."""

from __future__ import annotations

from dataclasses import dataclass, field

MODEL = "glm-4.5-fp8"

ADMIN_TOKEN = "chaos-admin-token-0123456789"

RUNTIME_TOKEN = "chaos-runtime-token-0123456789abcdef"

CLUSTER_SECRET = "chaos-cluster-secret-0123456789abcdef"


@dataclass
class ChaosConfig:
    """The scenario's sizes and times (module docstring)."""

    sessions: int = 18
    """Named sessions (a header names each)."""
    implicit: int = 6
    """Sessions without a session header."""
    replicas: int = 3
    runtimes: int = 2
    time_scale: float = 50.0
    max_tokens: int = 16
    think_s: tuple[float, float] = (0.1, 0.4)
    stop_s: float = 20.0
    """How long the runtime stays stopped (SIGSTOP → SIGCONT)."""
    pg_down_s: float = 0.0
    """How long PostgreSQL stays down between its stop and its start."""
    restart_replica: bool = True
    recovery_bound_s: float = 60.0
    """The longest wait for a recovery; past it the scenario stops there."""
    settle_rounds: int = 8
    """Steady load after each recovery, before the next fault: every session has had this
    many acknowledged calls."""
    seed: int = 0
    replica_env: dict[str, str] = field(default_factory=dict)
    """More settings for every replica."""
