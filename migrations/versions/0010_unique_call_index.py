"""A session's calls numbered without a repeat: ``ix_calls_session_key_call_index`` becomes
unique (proxy/store/call_numbers.py). Before, two replicas serving one session at once could
store two calls with one index (0, 1, 1, 2, 2, ...); such sessions' calls are renumbered first,
0, 1, 2, ... in the order (call_index, arrived_at, request_id), which keeps every other
session's numbers as they are.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_calls_session_key_call_index"

RENUMBER = sa.text(
    """
    UPDATE calls SET call_index = (
        SELECT ranked.n FROM (
            SELECT request_id,
                   row_number() OVER (
                       PARTITION BY session_key ORDER BY call_index, arrived_at, request_id
                   ) - 1 AS n
            FROM calls
            WHERE session_key IN (SELECT session_key FROM repeated)
        ) AS ranked
        WHERE ranked.request_id = calls.request_id
    )
    WHERE session_key IN (SELECT session_key FROM repeated)
    """
)
"""Renumbers the calls of the sessions in the temporary table ``repeated`` (window functions
and correlated subqueries: SQLite ≥ 3.25 and PostgreSQL alike)."""


def upgrade() -> None:
    op.drop_index(INDEX, table_name="calls")
    op.execute(
        "CREATE TEMPORARY TABLE repeated AS SELECT DISTINCT session_key FROM calls "
        "GROUP BY session_key, call_index HAVING count(*) > 1"
    )
    op.execute(RENUMBER)
    op.execute("DROP TABLE repeated")
    op.create_index(INDEX, "calls", ["session_key", "call_index"], unique=True)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="calls")
    op.create_index(INDEX, "calls", ["session_key", "call_index"], unique=False)
