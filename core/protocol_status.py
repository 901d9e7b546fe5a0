"""The proxy ↔ runtime protocol's node status (core/protocol.py has the map of the documents
and the version rule): the document of ``GET /v1/runtime/status``.

- **status**: ``InstanceStatus``'s fields plus the node's ``model_names``, recent ``slots`` and
  per-model ``engines`` info (``STATUS_EXTRA_KEYS``); never NaN nor Infinity (an entry holding
  one is left out, core/status.py ``status_json``; a reader leaves out only such an entry,
  ``lenient_status``, and one that does not decode, ``status_from_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from talaria.core.protocol import PROTOCOL_VERSION, ProtocolError, check_version
from talaria.core.status import InstanceStatus

STATUS_EXTRA_KEYS = (
    "v",
    "model_names",
    "slots",
    "engines",
    "draining_models",
    "weight_budget_bytes",
    "quantum_s",
    "server",
    "gpus",
)
"""Status document keys beyond ``InstanceStatus``'s fields."""


def status_to_dict(status: InstanceStatus, **extra: Any) -> dict[str, Any]:
    """The status document: ``status`` plus the node's extras (``STATUS_EXTRA_KEYS``)."""
    return {**status.to_dict(), **extra, "v": PROTOCOL_VERSION}


def status_from_dict(data: Mapping[str, Any], dropped: list[str] | None = None) -> InstanceStatus:
    """The ``InstanceStatus`` of a status document; an entry that does not decode is left out,
    named in ``dropped`` (core/status.py); ``ProtocolError`` for another version or worse."""
    check_version(data, "the runtime")
    body = {k: v for k, v in data.items() if k not in STATUS_EXTRA_KEYS}
    try:
        return InstanceStatus.from_dict(body, dropped)
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"bad status document: {exc!r}") from exc
