"""What a key may claim, and token counts past 2^31 (issue 46).

- ``api_keys.max_priority``: the highest class a key's calls may ask with
  ``X-Talaria-Priority`` (``talaria keys create --max-priority``); null, every key created
  before included: the key's own ``priority`` (a header may lower it, never raise it).
- ``calls.priority_asked`` and ``calls.priority_served``: the class a call's header asked
  (null: none) and the class it was served in; null for calls recorded before.
- Every token count that was ``INTEGER`` (int4 on PostgreSQL: at most 2,147,483,647) becomes
  ``BIGINT``: ``sessions.prompt_tokens``, ``cached_tokens``, ``output_tokens`` (sums over a
  session's calls), the same three of ``calls``, and ``api_keys.tpm``; values are kept.
  ``key_usage.tokens`` has been ``BIGINT`` since 0012. On SQLite, whose integers are 64-bit
  whatever the declared type, the tables are copied (Alembic's batch mode) so the declared
  type matches the models.

The downgrade narrows the columns back (a value past int4 fails it on PostgreSQL, rather than
being cut) and drops the three new ones.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_COLUMNS: tuple[tuple[str, tuple[tuple[str, bool], ...]], ...] = (
    ("sessions", (("prompt_tokens", False), ("cached_tokens", False), ("output_tokens", False))),
    ("calls", (("prompt_tokens", False), ("cached_tokens", False), ("output_tokens", False))),
    ("api_keys", (("tpm", True),)),
)
"""Per table, its token-count columns that were INTEGER, each with whether it is nullable."""


def _retype(wide: bool) -> None:
    old, new = (sa.Integer(), sa.BigInteger()) if wide else (sa.BigInteger(), sa.Integer())
    for table, columns in TOKEN_COLUMNS:
        with op.batch_alter_table(table) as batch:
            for name, nullable in columns:
                batch.alter_column(name, type_=new, existing_type=old, existing_nullable=nullable)


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("max_priority", sa.String(), nullable=True))
    op.add_column("calls", sa.Column("priority_asked", sa.String(), nullable=True))
    op.add_column("calls", sa.Column("priority_served", sa.String(), nullable=True))
    _retype(wide=True)


def downgrade() -> None:
    _retype(wide=False)
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("priority_served")
        batch.drop_column("priority_asked")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("max_priority")
