"""One meaning per name: ``session_key`` is the proxy's key of a session (``ses_<hex>``),
``session_id`` the client's id of it.

Columns renamed (values untouched):

- ``sessions``: ``session_id`` → ``session_key`` first (it frees the name), then
  ``external_id`` → ``session_id``, and ``parent_session_id`` → ``parent_session_key``;
- ``calls``, ``routing_decisions``, ``reservations``, ``hints``, ``responses``:
  ``session_id`` → ``session_key``.

Indexes whose names hold the old column names get the new names (on PostgreSQL
``ALTER INDEX ... RENAME TO``; SQLite cannot rename an index, so it is dropped and created
again on the renamed columns). The calls' foreign key constraint is renamed too
(``fk_calls_session_key_sessions``, as the models' naming convention names it): on PostgreSQL
in place; SQLite cannot rename a constraint, so ``calls`` is copied (Alembic's batch mode)
with the constraint under its new name (``RENAME COLUMN`` already pointed the reference at
``sessions.session_key``). SQLite ≥ 3.25 is needed (``ALTER TABLE ... RENAME COLUMN``).

The downgrade renames everything back, in the reverse order.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sessions", "session_id", "session_key"),  # before external_id takes its name
    ("sessions", "external_id", "session_id"),
    ("sessions", "parent_session_id", "parent_session_key"),
    ("calls", "session_id", "session_key"),
    ("routing_decisions", "session_id", "session_key"),
    ("reservations", "session_id", "session_key"),
    ("hints", "session_id", "session_key"),
    ("responses", "session_id", "session_key"),
)
"""(table, old name, new name), in the order of the upgrade."""

INDEXES: tuple[tuple[str, str, list[str], str, list[str]], ...] = (
    (
        "sessions",
        "ix_sessions_tenant_id_external_id",
        ["tenant_id", "external_id"],
        "ix_sessions_tenant_id_session_id",
        ["tenant_id", "session_id"],
    ),
    (
        "sessions",
        "ix_sessions_parent_session_id",
        ["parent_session_id"],
        "ix_sessions_parent_session_key",
        ["parent_session_key"],
    ),
    (
        "calls",
        "ix_calls_session_id_call_index",
        ["session_id", "call_index"],
        "ix_calls_session_key_call_index",
        ["session_key", "call_index"],
    ),
    (
        "routing_decisions",
        "ix_routing_decisions_session_id",
        ["session_id"],
        "ix_routing_decisions_session_key",
        ["session_key"],
    ),
    (
        "reservations",
        "ix_reservations_session_id",
        ["session_id"],
        "ix_reservations_session_key",
        ["session_key"],
    ),
    (
        "hints",
        "ix_hints_session_id",
        ["session_id"],
        "ix_hints_session_key",
        ["session_key"],
    ),
)
"""(table, old name, its columns before, new name, its columns after)."""

FOREIGN_KEY_BEFORE = "fk_calls_session_id_sessions"
FOREIGN_KEY_AFTER = "fk_calls_session_key_sessions"
"""The old and the new name of ``calls``' foreign key to ``sessions``."""


def _rename_columns(renames: Sequence[tuple[str, str, str]]) -> None:
    for table, old, new in renames:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")


def _rename_index(table: str, old: str, new: str, columns: list[str]) -> None:
    """Rename index ``old`` of ``table`` to ``new``, on ``columns`` (their current names)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER INDEX {old} RENAME TO {new}")
    else:
        op.drop_index(old, table_name=table)
        op.create_index(new, table, columns)


def _rename_foreign_key(old: str, new: str, column: str) -> None:
    """Rename ``calls``' foreign key ``old`` (on ``column``, to ``sessions.column``)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE calls RENAME CONSTRAINT {old} TO {new}")
        return
    with op.batch_alter_table("calls") as batch:
        batch.drop_constraint(old, type_="foreignkey")
        batch.create_foreign_key(new, "sessions", [column], [column])


def upgrade() -> None:
    _rename_columns(COLUMNS)
    for table, old, _, new, columns in INDEXES:
        _rename_index(table, old, new, columns)
    _rename_foreign_key(FOREIGN_KEY_BEFORE, FOREIGN_KEY_AFTER, "session_key")


def downgrade() -> None:
    _rename_columns([(table, new, old) for table, old, new in reversed(COLUMNS)])
    for table, old, columns, new, _ in reversed(INDEXES):
        _rename_index(table, new, old, columns)
    _rename_foreign_key(FOREIGN_KEY_AFTER, FOREIGN_KEY_BEFORE, "session_id")
