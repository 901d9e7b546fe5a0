"""Records ↔ rows ↔ views, derived from the types' own fields.

A stored field is declared twice: in its record (``talaria.proxy.contract.records``, what the
gateway writes) and in its row (``models.py``, the column, plus a migration). Everything between
them is derived here from ``dataclasses.fields``: :func:`row_values` turns a record into the column
values the batched writer inserts and updates (``batch.py``), and :func:`from_row` turns a row back
into a record or a view (``views.py``) by its field names. :data:`CORE_ROWS` says which row each
record is written to (:func:`record_rows` with the dialects' own tables) and
:data:`ROW_ONLY_COLUMNS` which columns a row has beyond its record's
fields; tests/store/test_store_mapping.py checks every row's columns against them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar, cast

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
from talaria.proxy.store.models import (
    Base,
    CallRow,
    DecisionRow,
    HintRow,
    InstanceRow,
    ReservationRow,
    SessionRow,
    as_utc,
)

SESSION_COUNTERS = ("calls", "prompt_tokens", "cached_tokens", "output_tokens")
"""The columns of ``sessions`` that sum its calls (``batch.py``): in no record."""

CORE_ROWS: dict[type[Record], type[Base]] = {
    SessionRecord: SessionRow,
    CallRecord: CallRow,
    DecisionRecord: DecisionRow,
    ReservationRecord: ReservationRow,
    HintRecord: HintRow,
    InstanceRecord: InstanceRow,
}
"""Each record type of the store's own and the row it is written to: a column per field, of
the same name."""


def record_rows() -> dict[type[Record], type[Base]]:
    """``CORE_ROWS`` and every dialect's ``TableRecord`` (of the dialects imported so far) with
    its ``ROW``."""
    return {**CORE_ROWS, **{kind: kind.ROW for kind in _table_records(TableRecord)}}


def _table_records(base: type[TableRecord]) -> list[type[TableRecord]]:
    found = []
    for kind in base.__subclasses__():
        found += [kind, *_table_records(kind)]
    return found


ROW_ONLY_COLUMNS: dict[type[Base], frozenset[str]] = {
    SessionRow: frozenset(SESSION_COUNTERS),
    DecisionRow: frozenset({"id"}),  # autoincrement keys
    HintRow: frozenset({"id"}),
}
"""The columns a row has beyond its record's fields (none where the row is absent)."""

View = TypeVar("View")
Convert = Callable[[Any], Any]


def _optional_utc(value: datetime | None) -> datetime | None:
    return None if value is None else as_utc(value)


def _converter(hint: Any) -> Convert | None:
    """How a record field of type ``hint`` becomes a column value: datetimes as aware UTC,
    JSON objects and arrays copied (shallow); None when the value is bound as it is."""
    if hint is datetime:
        return as_utc
    if isinstance(hint, types.UnionType) and datetime in typing.get_args(hint):
        return _optional_utc
    origin = typing.get_origin(hint) or hint
    if origin is dict:
        return dict
    if origin is list:
        return list
    return None


Columns = tuple[tuple[str, ...], tuple[tuple[str, Convert], ...]]


def _record_columns(kind: type[Any]) -> Columns:
    """A record type's fields: those bound as they are, and those converted (with how)."""
    hints = typing.get_type_hints(kind)
    plain: list[str] = []
    converted: list[tuple[str, Convert]] = []
    for field in dataclasses.fields(kind):
        convert = _converter(hints[field.name])
        if convert is None:
            plain.append(field.name)
        else:
            converted.append((field.name, convert))
    return tuple(plain), tuple(converted)


_COLUMNS: dict[type[Any], Columns] = {kind: _record_columns(kind) for kind in CORE_ROWS}


def row_values(record: Record) -> dict[str, Any]:
    """``record``'s fields as the column values of its row (:func:`record_rows`): each field
    under its own name, datetimes as aware UTC, dicts and lists copied."""
    kind = type(record)
    columns = _COLUMNS.get(kind)
    if columns is None:  # a dialect's own record, seen first
        columns = _COLUMNS[kind] = _record_columns(kind)
    plain, converted = columns
    values = {name: getattr(record, name) for name in plain}
    for name, convert in converted:
        values[name] = convert(getattr(record, name))
    return values


_VIEW_FIELDS: dict[type[Any], tuple[tuple[str, Convert | None], ...]] = {}


def _view_fields(kind: type[Any]) -> tuple[tuple[str, Convert | None], ...]:
    """A view type's fields, each with the copy its value gets (dicts and lists: shallow)."""
    fields = _VIEW_FIELDS.get(kind)
    if fields is None:
        hints = typing.get_type_hints(kind)
        copies: list[tuple[str, Convert | None]] = []
        for field in dataclasses.fields(kind):
            origin = typing.get_origin(hints[field.name]) or hints[field.name]
            copies.append((field.name, origin if origin in (dict, list) else None))
        fields = _VIEW_FIELDS[kind] = tuple(copies)
    return fields


def from_row(kind: type[View], row: object, **given: Any) -> View:
    """A ``kind`` (a record or view dataclass) from ``row``: each field is the row's attribute
    of the same name (dicts and lists copied, so the view shares nothing with the row),
    except those in ``given``, which the row has not."""
    values = dict(given)
    for name, copy in _view_fields(kind):
        if name not in values:
            value = getattr(row, name)
            values[name] = value if copy is None else copy(value)
    return cast(Callable[..., View], kind)(**values)
