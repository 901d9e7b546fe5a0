"""One bad entry never costs a whole status document (core/status.py, issue 46 item 4): the
runtime's encoder leaves out an entry holding NaN or ±infinity (valid JSON always), the
proxy's reader leaves out such an entry, and one that does not decode, and keeps the rest."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest

from talaria.core.protocol import ProtocolError
from talaria.core.protocol_status import status_from_dict, status_to_dict
from talaria.core.status import (
    InstanceStatus,
    ModelResidency,
    ModelState,
    SessionKvStatus,
    TenantShare,
    lenient_status,
    status_json,
    without_nonfinite,
)

GOOD = ModelResidency("a", ModelState.ACTIVE, 0.0)


def _document(**changes: Any) -> dict[str, Any]:
    """A status document of models ``a`` and ``b``, a session and a tenant, with ``changes``
    (``models.b.switch_s=…`` style keys: table, entry, field)."""
    status = InstanceStatus(
        "n0", 1.0, "a", {"a": GOOD, "b": ModelResidency("b", ModelState.HOST, 3.0)},
        sessions={"s1": SessionKvStatus("hbm", 100, "a", 0.0, 0.1)}, reserved={"s1": 1e9},
        tenants={"t": TenantShare(1.0)},
    )  # fmt: skip
    document = status_to_dict(status, model_names=["a", "b"], engines={"a": {"n": 1}})
    for path, value in changes.items():
        table, entry, *member = path.split(".")
        if member:
            document[table][entry][member[0]] = value
        else:
            document[table][entry] = value
    return document


@pytest.mark.parametrize(
    ("changes", "dropped"),
    [
        ({}, []),
        ({"models.b.switch_s": math.inf}, ["models.b"]),
        ({"models.b.next_slot_in_s": math.nan}, ["models.b"]),
        ({"sessions.s1.restore_s": -math.inf}, ["sessions.s1"]),
        ({"reserved.s1": math.nan}, ["reserved.s1"]),
        ({"tenants.t.served_s": math.inf}, ["tenants.t"]),
        ({"engines.a.n": math.nan}, ["engines.a"]),
        ({"models.a.switch_s": math.nan, "models.b.switch_s": math.nan}, ["models.a", "models.b"]),
    ],
)
def test_the_encoder_leaves_out_each_entry_holding_a_non_finite_number(
    changes: dict[str, float], dropped: list[str]
) -> None:
    body, left_out = status_json(_document(**changes))
    assert left_out == dropped
    decoded = msgspec.json.decode(body)  # strict: no NaN, no Infinity
    for name in dropped:
        table, entry = name.split(".")
        assert entry not in decoded[table]
    assert decoded["model_names"] == ["a", "b"]
    kept = status_from_dict(decoded)
    assert set(kept.models) == {"a", "b"} - {n.split(".")[1] for n in dropped if "models" in n}


def test_a_non_finite_number_outside_the_entries_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_utilization"):
        status_json(_document() | {"kv_utilization": math.nan})
    with pytest.raises(ValueError, match="at_s"):
        without_nonfinite(_document() | {"at_s": math.inf})


def test_the_reader_of_a_document_with_nan_keeps_every_other_entry() -> None:
    raw = json.dumps(_document(**{"models.b.switch_s": math.nan})).encode()
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(raw)
    data, dropped = lenient_status(raw)
    assert dropped == ["models.b"]
    status = status_from_dict(data)
    assert set(status.models) == {"a"} and status.reserved == {"s1": 1e9}
    for bad in (b"[1]", b"{", b'{"at_s": Infinity, "models": {}}'):
        with pytest.raises(ValueError):
            lenient_status(bad)


@pytest.mark.parametrize(
    ("change", "dropped"),
    [
        ({"models.b.switch_s": "3"}, "models.b"),  # a quoted number
        ({"models.b.waiting_calls": True}, "models.b"),  # a bool is not a number
        ({"models.b.state": "asleep"}, "models.b"),  # no such state
        ({"models.b.extra": 1}, "models.b"),  # a field this side does not know
        ({"models.b": 7}, "models.b"),
        ({"sessions.s1.tokens_x": 1}, "sessions.s1"),
        ({"reserved.s1": "1e9"}, "reserved.s1"),
        ({"tenants.t": None}, "tenants.t"),
    ],
)
def test_the_reader_leaves_out_an_entry_that_does_not_decode(change: dict[str, Any],
                                                              dropped: str) -> None:  # fmt: skip
    names: list[str] = []
    status = status_from_dict(_document(**change), names)
    assert names == [dropped]
    table, entry = dropped.split(".")
    assert entry not in getattr(status, table)
    assert "a" in status.models


def test_a_document_broken_outside_its_entries_is_refused() -> None:
    with pytest.raises(ProtocolError):
        status_from_dict(_document() | {"models": []})
    with pytest.raises(ProtocolError):
        status_from_dict({k: v for k, v in _document().items() if k != "models"})
