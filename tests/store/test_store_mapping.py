"""Each stored field is declared in its record and its row only: the rows' columns match the
records' fields (proxy/store/mapping.py), and a record comes back from its row unchanged."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Table

from talaria.proxy.contract.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    InstanceRecord,
    Record,
    ReservationRecord,
    SessionRecord,
    TableRecord,
)
from talaria.proxy.dialects.responses.tables import (
    ResponseRecord,
    StoredResponse,
    StoredResponseView,
)
from talaria.proxy.store.mapping import ROW_ONLY_COLUMNS, from_row, record_rows, row_values
from talaria.proxy.store.models import ApiKey, Base, DeadLetter, SessionRow
from talaria.proxy.store.views import ApiKeyInfo, DeadLetterView, SessionSummary

RECORD_ROWS = {
    record: row for record, row in record_rows().items() if record.__module__.startswith("talaria.")
}
"""The shipped records' rows, the Responses dialect's table included (imported above); a test's
own dialect (tests/integration/test_stateful_dialect.py), if imported first, is left out."""

FILLED_BY_THE_WRITER = {(SessionRecord, "session_id"), (DecisionRecord, "created_at")}
"""Record fields that may be None although their column is not: batch.py fills them in (the
session's key as its client id; the time of the write)."""

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def columns(row: type[Base]) -> dict[str, bool]:
    """Column name → nullable."""
    table = row.__table__
    assert isinstance(table, Table)
    return {c.name: bool(c.nullable) for c in table.columns}


def names(kind: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(kind)}


def optional(kind: type[Any], name: str) -> bool:
    hint = typing.get_type_hints(kind)[name]
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


@pytest.mark.parametrize("record", list(RECORD_ROWS), ids=lambda r: r.__name__)
def test_a_rows_columns_are_its_records_fields(record: type[Record]) -> None:
    row = RECORD_ROWS[record]
    assert set(columns(row)) == names(record) | ROW_ONLY_COLUMNS.get(row, frozenset())
    for name in names(record):
        if (record, name) not in FILLED_BY_THE_WRITER:
            assert optional(record, name) == columns(row)[name], f"{record.__name__}.{name}"


def test_every_record_type_has_a_row() -> None:
    core = set(typing.get_args(Record)) - {TableRecord}
    assert set(RECORD_ROWS) == core | {ResponseRecord}


def test_the_views_fields_are_their_rows_columns() -> None:
    assert names(SessionSummary) == set(columns(SessionRow))
    assert names(DeadLetterView) == set(columns(DeadLetter))
    assert names(StoredResponseView) <= set(columns(StoredResponse))
    assert names(ApiKeyInfo) - {"tenant_name", "deleted"} <= set(columns(ApiKey))


RECORDS: list[Record] = [
    SessionRecord("s1", "acme", "glm", T0, T0, "p1", "ended", T0, "client", "c1", "header"),
    CallRecord(
        *("r1", "s1", 3, "glm", "node0", T0, T0 + timedelta(seconds=2), "ok"),
        *(0.1, 0.05, 0.2, 0.3, 0.01, 0.02, 0.03, 0.04),  # queue_s .. engine_decode_s
        *(100, 20, 7, "stop", "hbm", True, 4.0, None, "chat"),  # prompt_tokens .. api
    ),
    DecisionRecord("r1", "s1", "talaria", "node0", "kv", {"node0": {"total": 1.0}}, T0),
    ReservationRecord("v1", "s1", "node0", 1e6, T0, T0, T0, T0, "returned"),
    HintRecord("s1", T0, 2.5, "bash", "end"),
    InstanceRecord("node0", "http", "http://n0", ["glm"], T0, {"ok": True}),
    ResponseRecord("resp_1", "acme", "s1", "glm", T0, T0, {"id": "resp_1"}, [{"id": "i"}], 42),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_a_record_comes_back_from_its_row(record: Record) -> None:
    values = row_values(record)
    assert set(values) == names(type(record))
    assert from_row(type(record), types.SimpleNamespace(**values)) == record


def test_every_record_type_is_round_tripped() -> None:
    assert {type(r) for r in RECORDS} == set(RECORD_ROWS)


def test_row_values_are_utc_and_copied() -> None:
    local = datetime(2026, 11, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    values = row_values(HintRecord("s1", local, None))
    assert values["at"] == T0 and values["at"].tzinfo is UTC
    naive = row_values(SessionRecord("s1", "a", "m", T0.replace(tzinfo=None), T0))
    assert naive["started_at"].tzinfo is UTC and naive["ended_at"] is None
    instance = InstanceRecord("n", "http", None, ["glm"], T0, {"k": 1})
    values = row_values(instance)
    assert values["models"] == ["glm"] and values["models"] is not instance.models
    assert values["status"] == {"k": 1} and values["status"] is not instance.status
