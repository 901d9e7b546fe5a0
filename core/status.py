"""What a runtime instance reports about itself: the snapshot the proxy's routing scorers read.

It is plain data (no methods that do I/O), the same whether it comes from an in-process node or,
later, over HTTP as JSON (``to_dict`` / ``from_dict``).

One bad entry never costs the whole snapshot (issue 46): ``from_dict`` leaves out, and names,
an entry of its keyed tables (``STATUS_TABLES``) that does not decode (a missing or unknown
field, a model's number that is not a finite number), and ``without_nonfinite`` takes out of a
document each entry holding NaN or ±infinity, which JSON cannot carry: the runtime's
``status_json`` writes no such entry, and the proxy's ``lenient_status`` reads a document with
one (a strict parser refuses the whole document) without it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from talaria.core.gap_model import GapFigures

STATUS_TABLES = ("models", "sessions", "reserved", "tenants")
"""The keyed tables of a status document: one entry per model, session or tenant."""
DOCUMENT_TABLES = (*STATUS_TABLES, "engines")
"""With the node's per-model ``engines`` info (an extra of core/protocol_status.py's document)."""


class ModelState(StrEnum):
    """Where a model's weights are on an instance."""

    ACTIVE = "active"  # weights in HBM, serving now
    STAGED = "staged"  # weights (partly) staged in free HBM for the next switch
    HOST = "host"  # asleep: weights in host memory, a wake-up away


@dataclass(frozen=True)
class ModelResidency:
    """One model on an instance: where its weights are and how soon it would serve."""

    model: str
    state: ModelState
    next_slot_in_s: float
    """Estimated seconds until this model serves on the instance (0 when active): the rest of the
    current slot if it is contended, plus a quantum and a switch for each model ahead of it in the
    round-robin order that has waiting calls, plus its own switch."""
    staged_fraction: float = 0.0
    """Fraction of its weights already staged in HBM (0–1)."""
    switch_s: float = 0.0
    """Seconds a switch to this model would take now (wake, or the rest of staging + D2D)."""
    waiting_calls: int = 0
    """Calls queued on the instance for this model."""
    live_sessions: int = 0
    """Sessions of this model living on the instance: a call queued or running, or back from
    one within the scheduler's stale window (a tool gap)."""


@dataclass(frozen=True)
class SlotView:
    """One time slot of the instance, in clock seconds: the switch into it began at
    ``start_s`` and its model began serving at ``start_s + switch_s``; ``end_s`` is None while
    the slot is open, then the time it closed, for ``close`` (a ``CloseReason`` value).
    ``admitted``: calls admitted in it."""

    model: str
    start_s: float
    switch_s: float
    end_s: float | None = None
    close: str | None = None
    admitted: int = 0


RECENT_SLOTS = 24
"""How many of the latest slots ``InstanceStatus.recent_slots`` holds."""


@dataclass(frozen=True)
class SessionKvStatus:
    """Where one session's KV cache is on the instance, and what reusing it would cost
    (seconds)."""

    location: str  # "hbm" or "host"
    tokens: int
    model: str
    restore_s: float  # host → HBM transfer time (0 in HBM)
    recompute_s: float  # prefill time if the KV were gone


@dataclass(frozen=True)
class TenantShare:
    """One tenant's part of an instance now (``tenants`` of ``InstanceStatus``, keyed by the
    tenant's digest, ``CallRequest.tenant``): the service seconds its calls have had here
    (admission to finish, measured), its calls waiting and running, and how long its oldest
    waiting call has waited (seconds; 0 with none waiting)."""

    served_s: float = 0.0
    waiting_calls: int = 0
    running_calls: int = 0
    oldest_wait_s: float = 0.0


@dataclass(frozen=True)
class InstanceStatus:
    """One instance's snapshot at ``at_s`` (seconds of its clock): its models, the KV of its
    sessions (keyed by ``session_key``: the proxy's key of the session), its reservations,
    queues and recent slots."""

    instance: str
    at_s: float
    active_model: str | None
    models: dict[str, ModelResidency]
    sessions: dict[str, SessionKvStatus] = field(default_factory=dict)
    reserved: dict[str, float] = field(default_factory=dict)
    """session → bytes its soft reservation holds on this instance."""
    waiting_calls: int = 0
    waiting_prompt_tokens: int = 0
    running_calls: int = 0
    kv_utilization: float = 0.0
    """KV bytes in HBM ÷ HBM left for KV after weights (0–1)."""
    recent_slots: list[SlotView] = field(default_factory=list)
    """The last ``RECENT_SLOTS`` slots, oldest first (the open one last)."""
    tenants: dict[str, TenantShare] = field(default_factory=dict)
    """Per tenant digest with calls here so far: its share of the service and its queue."""
    gap_models: dict[str, GapFigures] = field(default_factory=dict)
    """Per gap model the node keeps (``mean``; ``log-normal`` with ``learned_gaps``): how well
    it predicted its sessions' tool gaps so far (core/gap_model.py)."""

    @property
    def reserved_bytes(self) -> float:
        """Bytes held by all soft reservations on the instance."""
        return sum(self.reserved.values())

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON-ready data (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], dropped: list[str] | None = None) -> InstanceStatus:
        """The snapshot ``to_dict`` wrote (nested dataclasses and enums rebuilt). An entry of
        a keyed table that does not decode is left out and named in ``dropped``
        (``models.<name>``); a malformed document otherwise raises ``TypeError``,
        ``ValueError`` or ``KeyError``."""
        out: list[str] = [] if dropped is None else dropped
        models = _entries(data["models"], _residency, "models", out)
        sessions = _entries(data.get("sessions", {}), _kv, "sessions", out)
        reserved = _entries(data.get("reserved", {}), _bytes, "reserved", out)
        tenants = _entries(data.get("tenants", {}), _share, "tenants", out)
        gap_models = _entries(data.get("gap_models", {}), _figures, "gap_models", out)
        slots = [SlotView(**s) for s in data.get("recent_slots", ())]
        rest = {k: v for k, v in data.items() if k not in (*STATUS_TABLES, *_NESTED)}
        return cls(
            models=models, sessions=sessions, reserved=reserved, recent_slots=slots,
            tenants=tenants, gap_models=gap_models, **rest,
        )  # fmt: skip


_NESTED = ("recent_slots", "gap_models")
"""The members ``from_dict`` builds besides the keyed tables."""


T = TypeVar("T")


def _entries(table: Any, build: Callable[[Any], T], name: str, dropped: list[str]) -> dict[str, T]:
    """``table``'s entries built by ``build``; one that fails is left out, named."""
    if not isinstance(table, Mapping):
        raise TypeError(f"{name} must be an object")
    out: dict[str, T] = {}
    for key, value in table.items():
        try:
            out[key] = build(value)
        except (TypeError, ValueError, KeyError):
            dropped.append(f"{name}.{key}")
    return out


def _residency(data: Any) -> ModelResidency:
    """A model's entry: its numbers real and finite (routing scores them), else ``ValueError``."""
    entry = ModelResidency(**{**data, "state": ModelState(data["state"])})
    for spec in fields(entry):
        value = getattr(entry, spec.name)
        if spec.type in ("float", "int") and not _real(value):
            raise ValueError(f"{spec.name} is not a finite number: {value!r}")
    return entry


def _kv(data: Any) -> SessionKvStatus:
    return SessionKvStatus(**data)


def _share(data: Any) -> TenantShare:
    return TenantShare(**data)


def _figures(data: Any) -> GapFigures:
    return GapFigures(**data)


def _bytes(value: Any) -> float:
    if not _real(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def _real(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and is_finite(value)


def is_finite(value: Any) -> bool:
    """Whether every number in ``value`` (its lists and objects too) is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(is_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(is_finite(v) for v in value)
    return True


def without_nonfinite(
    document: Mapping[str, Any], tables: Iterable[str] = STATUS_TABLES
) -> tuple[dict[str, Any], list[str]]:
    """``document`` less each entry of its keyed ``tables`` that holds a NaN or an infinity,
    and those entries' names (``models.<name>``); ``ValueError`` naming the member if such a
    number is anywhere else (the snapshot as a whole is wrong: nothing to leave out)."""
    out, dropped = dict(document), []
    for name in tables:
        table = out.get(name)
        if isinstance(table, dict) and not is_finite(table):
            out[name] = {k: v for k, v in table.items() if is_finite(v)}
            dropped += [f"{name}.{k}" for k in table if k not in out[name]]
    bad = [k for k, v in out.items() if not is_finite(v)]
    if bad:
        raise ValueError(f"status members {bad} hold a number that is not finite")
    return out, dropped


def status_json(document: Mapping[str, Any]) -> tuple[bytes, list[str]]:
    """A status document as JSON text without NaN or Infinity: each entry of a keyed table
    (``DOCUMENT_TABLES``) holding one is left out, named in the list (``ValueError`` if one
    is elsewhere). Only a document that strict encoding refuses is searched."""
    try:
        return json.dumps(document, allow_nan=False).encode(), []
    except ValueError:
        clean, dropped = without_nonfinite(document, DOCUMENT_TABLES)
    return json.dumps(clean, allow_nan=False).encode(), dropped


def lenient_status(raw: bytes) -> tuple[dict[str, Any], list[str]]:
    """A status document strict JSON refused (``NaN``, ``Infinity``, ``1e400``), read by
    Python's parser, each entry of a keyed table holding such a number left out, named in the
    list: one bad model's entry does not cost the others. ``ValueError`` if it is not a JSON
    object, or such a number is elsewhere."""
    try:
        data = json.loads(raw)
    except RecursionError as exc:
        raise ValueError("status document nested too deep") from exc
    if not isinstance(data, dict):
        raise ValueError("status document is not a JSON object")
    return without_nonfinite(data, DOCUMENT_TABLES)
